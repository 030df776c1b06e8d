"""Dead letters end to end with real Spark (a member of a shared application, so that its
restart is warm): records that do not parse are counted exactly (the collector's round, the
API, Prometheus, the overview); after a schema fix they are redriven to the source topic
and the pipeline writes them; those that still do not parse come back as dead letters at
their new offsets, nothing twice."""

from __future__ import annotations

import psycopg
import pytest
from django.utils import timezone

from controlplane.definitions.models import AuditEntry, PipelineFigures, RunState
from controlplane.observability import collector
from tests.kafka_helpers import produce
from tests.runs import POLICY, current, new_pipeline, sink_rows, tick_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def sink_count(sink_dsn: str, table: str) -> int:
    try:
        with psycopg.connect(sink_dsn) as conn:
            return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    except psycopg.errors.UndefinedTable:
        return 0


def test_dead_letters_are_counted_exactly_and_redriven_after_a_schema_fix(
    api,
    client,
    user,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    shared,
):
    topic, table = new_pipeline(api, kafka_bootstrap, "letters", restart_policy=POLICY)
    from controlplane.definitions.models import Pipeline

    Pipeline.objects.filter(name="letters").update(placement="shared")
    values = []
    for i in range(42):
        if i % 14 in (3, 7, 11):
            values.append({"id": f"b{i}", "n": str(i)})  # a string where the schema says INT
        elif i % 14 == 13:
            values.append(b"not json at all")
        else:
            values.append({"id": f"g{i}", "n": i})
    produce(kafka_bootstrap, topic, values)  # 14 records a partition

    def committed(each: int) -> bool:
        seen = api.get("/api/pipelines/letters/offsets/").json()["committed"]
        return seen == {topic: {"0": each, "1": each, "2": each}}

    assert api.post("/api/pipelines/letters/start/").status_code == 202
    tick_until(lambda: sink_count(sink_dsn, table) == 30 and committed(14), 240, "the first batch")

    collector.collect(timezone.now())
    assert PipelineFigures.objects.get(pipeline__name="letters").dead_letters == 12
    assert api.get("/api/pipelines/letters/metrics/").json()["dead_letters"]["count"] == 12
    assert 'cp_dead_letters{pipeline="letters"} 12.0' in api.get("/metrics").content.decode()
    client.force_login(user)
    overview = client.get("/").content.decode()
    assert 'href="/pipelines/letters/dead-letters" class="dead-letters">12</a>' in overview
    summary = api.get("/api/pipelines/letters/dead-letters/batches/").json()
    assert sum(b["count"] for b in summary["batches"]) == 12
    schema_error = "value does not parse as JSON with schema: id STRING, n INT"
    assert summary["errors"] == [{"error": schema_error, "count": 12}]
    listed = api.get("/api/pipelines/letters/dead-letters/", {"limit": 500}).json()
    assert sorted(r["offset"] for r in listed["results"]) == sorted(
        i // 3 for i in range(42) if i % 14 in (3, 7, 11, 13)
    )

    # The schema fix: n arrives as a string now and then; read it as text, cast it.
    spec = {
        "source": {"schema": "id STRING, n STRING"},
        "transform": {"sql": "SELECT id, CAST(n AS INT) AS n FROM source"},
    }
    assert api.patch("/api/pipelines/letters/", {"spec": spec}, format="json").status_code == 200
    assert api.post("/api/pipelines/letters/restart/", {"reason": "schema fix"}).status_code == 202
    tick_until(
        lambda: (
            current("letters").spec_version == 2 and current("letters").state == RunState.RUNNING
        ),
        120,
        "the fixed version running",
    )
    body = {"to": "source", "reason": "schema fixed in v2"}
    response = api.post("/api/pipelines/letters/dead-letters/redrive/", body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "redriven": 12,
        "failed": 0,
        "remaining": 0,
        "to": "source",
        "error": None,
    }

    def redriven_letters() -> list[dict]:
        return api.get("/api/pipelines/letters/dead-letters/").json()["results"]

    tick_until(
        lambda: sink_count(sink_dsn, table) == 39 and len(redriven_letters()) == 3,
        120,
        "the redriven records written, the garbage back",
    )
    rows = sink_rows(sink_dsn, table)
    assert {k: v for k, v in rows.items() if k.startswith("b")} == {
        f"b{i}": i for i in range(42) if i % 14 in (3, 7, 11)
    }
    back = redriven_letters()
    assert {r["raw_text"] for r in back} == {"not json at all"}
    assert all(r["offset"] >= 14 for r in back)  # at their new offsets
    assert back[0]["error"] == "value does not parse as JSON with schema: id STRING, n STRING"
    assert AuditEntry.objects.get(action="dead-letters-redrive").reason == "schema fixed in v2"
