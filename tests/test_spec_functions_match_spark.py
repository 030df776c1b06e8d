"""The transform function allow-list (jobs/spec/functions.py) against a real Spark session.

Every function Spark lists must have been reviewed: in ALLOWED or in REFUSED, never both, so
a Spark upgrade that adds one fails here until someone decides. And the attacks the allow-list
exists for are real: Spark itself runs them, check_transform_sql refuses them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from jobs.spec.functions import ALLOWED, ALLOWED_BY_GROUP, GRAMMAR_FUNCTIONS, REFUSED
from jobs.spec.sql import _GENERATOR_FUNCTIONS, SQLError, check_transform_sql

# A view of its own: the session is shared by the whole run.
VIEW = "cp_function_attacks"


def listed(spark: SparkSession, which: str = "SYSTEM") -> set[str]:
    # Operators, CASE and the table-valued functions (range, sql_keywords...) are listed too.
    return {row[0] for row in spark.sql(f"SHOW {which} FUNCTIONS").collect()}


@pytest.mark.spark
def test_every_function_spark_lists_is_allowed_or_refused(spark: SparkSession) -> None:
    names = listed(spark)
    reviewed = ALLOWED | set(REFUSED)
    assert names - reviewed == set(), "functions Spark has that nobody reviewed"
    assert reviewed - names == set(), "reviewed functions Spark doesn't have (any more)"
    # SHOW FUNCTIONS is the built-in ones and the session's own (user) functions, which a
    # transform cannot call: sql.py allows only names in ALLOWED.
    assert listed(spark, "") == names | listed(spark, "USER")


@pytest.mark.spark
def test_the_forms_spark_parses_itself_are_not_listed_but_run(spark: SparkSession) -> None:
    assert GRAMMAR_FUNCTIONS.isdisjoint(listed(spark))
    row = spark.sql(
        "SELECT timestampadd(HOUR, 1, TIMESTAMP '2020-01-01 00:00:00') AS a, "
        "timestampdiff(HOUR, TIMESTAMP '2020-01-01', TIMESTAMP '2020-01-02') AS b, "
        "timediff(HOUR, TIMESTAMP '2020-01-01', TIMESTAMP '2020-01-02') AS c, "
        "try_cast('7' AS INT) AS d"
    ).collect()[0]
    assert (row.b, row.c, row.d) == (24, 24, 7)


def test_allowed_and_refused_are_disjoint_and_lower_case() -> None:
    assert ALLOWED.isdisjoint(REFUSED)
    assert ALLOWED.isdisjoint(GRAMMAR_FUNCTIONS)
    assert all(name == name.lower() for name in ALLOWED | set(REFUSED) | GRAMMAR_FUNCTIONS)
    assert all(reason and not reason.endswith(".") for reason in REFUSED.values())
    for group, names in ALLOWED_BY_GROUP.items():  # readable: sorted, listed once
        assert names.split() == sorted(set(names.split())), group
    assert sum(len(names.split()) for names in ALLOWED_BY_GROUP.values()) == len(ALLOWED)


def test_the_row_generators_a_transform_may_read_are_allowed_functions() -> None:
    assert _GENERATOR_FUNCTIONS <= ALLOWED


def test_the_functions_issue_12_names_are_refused() -> None:
    must_refuse = {"reflect", "java_method", "try_reflect", "current_user", "user"}
    must_refuse |= {"session_user", "from_xml", "schema_of_xml", "xpath", "xpath_string"}
    assert must_refuse <= set(REFUSED)


@pytest.fixture(scope="module")
def attack_view(spark: SparkSession) -> Iterator[str]:
    spark.sql("SELECT 'a' AS id, array('x') AS tags").createOrReplaceTempView(VIEW)
    yield VIEW
    spark.catalog.dropTempView(VIEW)


ATTACKS = {
    # what Spark returns for it, checked below: proof that the refusal matters
    f"SELECT reflect('java.lang.Integer', 'parseInt', '7') AS x FROM {VIEW}": "7",
    f"SELECT TRANSFORM(id) USING 'tr a b' AS (x STRING) FROM {VIEW}": "b",
    f"SELECT java_method('java.lang.String', 'valueOf', 42) AS x FROM {VIEW}": "42",
    f"SELECT `ReFlect`('java.lang.Integer', 'parseInt', '8') AS x FROM {VIEW}": "8",
    f"SELECT system.builtin.reflect('java.lang.Integer', 'parseInt', '9') AS x FROM {VIEW}": "9",
    f"SELECT IDENTIFIER('reflect')('java.lang.Integer', 'parseInt', '6') AS x FROM {VIEW}": "6",
    f"FROM {VIEW} MAP id USING 'tr a c' AS (x)": "c",
}


@pytest.mark.spark
@pytest.mark.parametrize("sql", list(ATTACKS))
def test_spark_runs_each_attack_and_the_check_refuses_it(
    spark: SparkSession, attack_view: str, sql: str
) -> None:
    with pytest.raises(SQLError, match="which is not allowed"):
        check_transform_sql(sql, source_view=attack_view, columns=["id", "tags"])
    # The test could fail: Spark would run this very text.
    assert spark.sql(sql).collect()[0][0] == ATTACKS[sql]


@pytest.mark.spark
def test_a_bare_user_is_the_os_user_in_spark_and_refused_here(
    spark: SparkSession, attack_view: str
) -> None:
    sql = f"SELECT user AS u FROM {attack_view}"
    with pytest.raises(SQLError, match="function 'user'"):
        check_transform_sql(sql, source_view=attack_view, columns=["id", "tags"])
    assert spark.sql(sql).collect()[0].u  # the name of the user Spark runs as
