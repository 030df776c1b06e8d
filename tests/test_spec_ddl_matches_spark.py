"""The JVM-free checkers agree with Spark 4.3 itself.

jobs/spec/ddl.py and jobs/spec/sql.py re-implement parts of Spark's parser so that the web
app can validate specs without a JVM. Here the shared local SparkSession is the referee:
every DDL string below must be accepted by both with the same simpleString, or rejected by
both; every transform must get the same verdict from check_transform_sql as from Spark's
parser and analyzer. The places where the modules are deliberately stricter than Spark are
listed separately, with the reason, so that a change on either side shows up here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException, ParseException, PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.types import DataType, StructType

from jobs.spec.ddl import DDLError, parse_schema, simple_string, to_ddl
from jobs.spec.sql import SQLError, check_transform_sql

pytestmark = pytest.mark.spark

# -- DDL -------------------------------------------------------------------------------------

DDL_CORPUS = [
    # accepted
    "id STRING, amount DOUBLE, ts TIMESTAMP",
    "a BOOLEAN, b TINYINT, c BYTE, d SMALLINT, e SHORT, f INT, g INTEGER, h BIGINT, i LONG",
    "a FLOAT, b REAL, c DOUBLE, d DATE, e BINARY, f VARIANT, g VOID",
    "a DECIMAL, b DEC(5), c NUMERIC(38, 38), d decimal( 010 , 02 ), e DECIMAL(0)",
    "a VARCHAR(10), b CHAR(3), c CHARACTER(1)",
    "a TIMESTAMP_LTZ, b TIMESTAMP_NTZ, c TIMESTAMP(6), d TIMESTAMP WITHOUT TIME ZONE",
    "a TIME, b TIME(0), c TIME(9) WITHOUT TIME ZONE",
    "a INTERVAL, b INTERVAL YEAR TO MONTH, c INTERVAL DAY TO SECOND, d INTERVAL MINUTE",
    "a STRING COLLATE utf8_binary, b STRING COLLATE UTF8_LCASE, c STRING COLLATE unicode_ai_ci",
    "a ARRAY<ARRAY<INT>>, b MAP<STRING, ARRAY<STRUCT<x: INT, y STRING NOT NULL>>>",
    "a STRUCT<>, b STRUCT< >, c MAP<ARRAY<INT>, STRUCT<>>",
    "a STRUCT<x: INT NOT NULL COMMENT 'c', `y z`: DECIMAL(5, 2)>",
    "`a``b` INT, `c d` INT, `` INT, 1a INT, _ INT, select INT, not INT",
    "id: STRING, n: INT",
    "STRUCT<id: STRING, n: INT>",
    "a INT NOT NULL COMMENT 'x', b INT ! NULL, c INT COMMENT \"d\" 'e'",
    "a INT -- comment\n, b INT /* nested /* comment */ */",
    "  a\tINT ,\n b\u00a0INT  ",
    # rejected
    "a",
    "a INT,",
    "a INT b",
    "a FOOBAR",
    "a ARRAY<INT",
    "a MAP<INT, BOOLEAN>>",
    "a MAP<INT>",
    "a STRUCT<x INT,>",
    "a DECIMAL(39)",
    "a DECIMAL(5, 6)",
    "a DECIMAL(5, -1)",
    "a INT(10)",
    "a CHAR",
    "a TIMESTAMP(3)",
    "a TIME(10)",
    "a INTERVAL MONTH TO MONTH",
    "a INTERVAL DAY TO DAY",
    "a-b INT",
    "123 INT",
    "1e5 INT",
    "a INT COMMENT 'x' NOT NULL",
    "a INT NULL",
    "a INT DEFAULT 1",
    "a INT;",
    "a INT COMMENT 'unterminated",
    "a INT /* unclosed",
    "INT",
    "ARRAY<INT>",
]

# Spark accepts these; this module rejects them on purpose.
STRICTER_THAN_SPARK = {
    "": "an empty schema is a mistake; PySpark turns it into an empty struct",
    "struct<>": "same, spelled as a struct",
    "a INT, A STRING": "duplicate names make every reference to the column ambiguous",
    "p STRUCT<x: INT, X: INT>": "same, for struct fields",
    "a STRING COLLATE de_CI": "locale collations are not modelled",
    "a GEOMETRY(4326)": "spatial types are not modelled",
}


def spark_simple_string(ddl: str) -> str | None:
    """What PySpark makes of a schema string (None: rejected, or not a struct)."""
    try:
        parsed = DataType.fromDDL(ddl)
    except (PySparkException, Py4JJavaError):
        return None
    return parsed.simpleString() if isinstance(parsed, StructType) else None


def our_simple_string(ddl: str) -> str | None:
    try:
        return simple_string(parse_schema(ddl))
    except DDLError:
        return None


@pytest.mark.parametrize("ddl", DDL_CORPUS)
def test_the_ddl_parser_accepts_exactly_what_spark_accepts(spark: SparkSession, ddl: str) -> None:
    assert our_simple_string(ddl) == spark_simple_string(ddl)


def test_the_corpus_has_both_accepted_and_rejected_schemas(spark: SparkSession) -> None:
    verdicts = [spark_simple_string(ddl) is not None for ddl in DDL_CORPUS]
    assert 15 <= sum(verdicts) <= len(verdicts) - 15


@pytest.mark.parametrize("ddl", list(STRICTER_THAN_SPARK))
def test_the_ddl_parser_is_stricter_than_spark_only_on_purpose(
    spark: SparkSession, ddl: str
) -> None:
    assert spark_simple_string(ddl) is not None
    with pytest.raises(DDLError):
        parse_schema(ddl)


def test_spark_cannot_select_a_column_whose_name_is_duplicated(spark: SparkSession) -> None:
    frame = spark.createDataFrame([], "a INT, A STRING")
    with pytest.raises(AnalysisException, match="AMBIGUOUS_REFERENCE"):
        frame.select("a")


@pytest.mark.parametrize("ddl", [ddl for ddl in DDL_CORPUS if our_simple_string(ddl) is not None])
def test_to_ddl_output_is_accepted_by_the_strictest_spark_parser(
    spark: SparkSession, ddl: str
) -> None:
    """The JVM's StructType.fromDDL (behind readStream.schema) rejects ``name: type``."""
    schema = parse_schema(ddl)
    jvm_schema = spark._jvm.org.apache.spark.sql.types.StructType.fromDDL(to_ddl(schema))
    assert jvm_schema.simpleString() == simple_string(schema)
    for ours, theirs in zip(schema.fields, jvm_schema.fields(), strict=True):
        comment = theirs.getComment()
        assert (ours.nullable, ours.comment) == (
            theirs.nullable(),
            comment.get() if comment.isDefined() else None,
        )


# -- transform SQL ---------------------------------------------------------------------------

SOURCE_SCHEMA = (
    "id STRING, amount DOUBLE, ts TIMESTAMP, payload STRUCT<id: STRING, n: INT>, tags ARRAY<STRING>"
)

SQL_CORPUS = [
    # accepted by both
    "SELECT * FROM source",
    "WITH big AS (SELECT id, amount AS amt FROM source WHERE amount > 1) SELECT id, amt FROM big",
    "SELECT id, row_number() OVER (PARTITION BY id ORDER BY ts DESC) AS rn FROM source",
    "SELECT window.start, count(*) AS n FROM source GROUP BY window(ts, '5 minutes')",
    "SELECT transform(tags, t -> upper(t)) AS up, filter(tags, t -> t <> id) AS other FROM source",
    "SELECT payload.id, source.payload.n FROM source ORDER BY id",
    "SELECT CASE WHEN amount > 1 THEN 'big' ELSE 'small' END AS size, CAST(ts AS DATE) FROM source",
    "SELECT amount AS a, a * 2 AS b FROM source",
    "SELECT id, count(*) AS n FROM source GROUP BY id HAVING n > 1",
    "SELECT id, CAST(amount AS INT) FROM source ORDER BY amount",
    "SELECT id FROM source s WHERE amount > (SELECT avg(amount) FROM source WHERE id = s.id)",
    "SELECT id, tag FROM source LATERAL VIEW explode(tags) t AS tag",
    "SELECT id FROM source UNION ALL SELECT payload.id FROM source",
    "SELECT id FROM session.source",
    # rejected by both
    "SELECT id FROM source WHERE (id = 'a'",
    "SELECT 'abc FROM source",
    "SELECT amout FROM source",
    "SELECT s.amout FROM source s",
    "SELECT amount AS a FROM source WHERE a > 1",
    "SELECT b, amount AS b FROM source",
    "WITH t AS (SELECT id, amount AS amt FROM source) SELECT amount FROM t",
    "WITH t AS (SELECT upper(id) FROM source) SELECT id FROM t",
    "SELECT id FROM source JOIN orders USING (id)",
    "SELECT id FROM source WHERE id IN (SELECT id FROM archive)",
    "SELECT * FROM default.source",
]

# Spark runs these; check_transform_sql rejects them on purpose: not streaming transforms.
SQL_STRICTER_THAN_SPARK = ["SELECT 1", "SELECT * FROM range(3)", "VALUES (1)"]
# Statements Spark parses, but that are no query; they are parsed here, never run.
SQL_STATEMENTS = ["DROP TABLE source", "SHOW TABLES", "SET spark.sql.shuffle.partitions = 1"]
# Where sqlglot's parser and Spark's disagree (see the jobs/spec/sql.py docstring).
SQL_PARSER_GAPS = {
    "TABLE source": "accepted by Spark, a syntax error for sqlglot",
    "SELECT id,, amount FROM source": "a syntax error for Spark, accepted by sqlglot",
}

# Spark errors that correspond to what check_transform_sql checks.
CHECKED_CONDITIONS = ("UNRESOLVED_COLUMN", "TABLE_OR_VIEW_NOT_FOUND")


@pytest.fixture(scope="module")
def source_columns(spark: SparkSession) -> Iterator[list[str]]:
    """The view every transform reads, and its columns as the web app knows them."""
    spark.createDataFrame([], SOURCE_SCHEMA).createOrReplaceTempView("source")
    yield [f.name for f in parse_schema(SOURCE_SCHEMA).fields]
    spark.catalog.dropTempView("source")


def spark_accepts(spark: SparkSession, sql: str) -> bool:
    """Parse and analyze (not run) the query; fail on errors that no check here models."""
    try:
        spark.sql(sql)
    except ParseException:
        return False
    except AnalysisException as e:
        condition = e.getCondition() or ""
        assert condition.startswith(CHECKED_CONDITIONS), f"{sql!r}: {e}"
        return False
    return True


def we_accept(sql: str, columns: list[str]) -> bool:
    try:
        check_transform_sql(sql, columns=columns)
    except SQLError:
        return False
    return True


@pytest.mark.parametrize("sql", SQL_CORPUS)
def test_the_sql_check_agrees_with_spark(
    spark: SparkSession, source_columns: list[str], sql: str
) -> None:
    assert we_accept(sql, source_columns) == spark_accepts(spark, sql)


def test_the_sql_corpus_has_both_accepted_and_rejected_queries(
    spark: SparkSession, source_columns: list[str]
) -> None:
    verdicts = [spark_accepts(spark, sql) for sql in SQL_CORPUS]
    assert 8 <= sum(verdicts) <= len(verdicts) - 8


@pytest.mark.parametrize("sql", SQL_STRICTER_THAN_SPARK)
def test_the_sql_check_is_stricter_than_spark_only_on_purpose(
    spark: SparkSession, source_columns: list[str], sql: str
) -> None:
    assert spark_accepts(spark, sql)
    with pytest.raises(SQLError, match="never reads the view 'source'"):
        check_transform_sql(sql, columns=source_columns)


@pytest.mark.parametrize("sql", SQL_STATEMENTS)
def test_statements_that_spark_parses_are_still_not_transforms(
    spark: SparkSession, source_columns: list[str], sql: str
) -> None:
    spark._jsparkSession.sessionState().sqlParser().parsePlan(sql)  # parses; not executed
    with pytest.raises(SQLError, match=r"must be a query \(SELECT \.\.\.\)"):
        check_transform_sql(sql, columns=source_columns)


@pytest.mark.parametrize("sql", list(SQL_PARSER_GAPS))
def test_the_known_parser_gaps_are_still_there(
    spark: SparkSession, source_columns: list[str], sql: str
) -> None:
    """If sqlglot closes one of these gaps, update the docstring of jobs/spec/sql.py."""
    assert we_accept(sql, source_columns) != spark_accepts(spark, sql)
