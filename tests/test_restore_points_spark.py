"""A bad deploy undone with real Spark (a member of a shared application, so that each
restart is warm): a restore point taken while the pipeline runs; more data; a new spec
version (its first run keeps the old version's checkpoint first) that writes wrong values;
a rollback (the older spec runs again) and a restore to the restore point: the batches after
it are read again and the upsert sink ends exactly as a run of the good spec that never
moved would have left it, rewritten under the restored checkpoint's new query id."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from controlplane.definitions.models import AuditEntry, Pipeline, RestorePoint, RunState
from jobs.checkpoints import read_checkpoint
from jobs.sinks.postgres.store import COMMITS_TABLE
from tests.kafka_helpers import produce
from tests.runs import POLICY, current, new_pipeline, sink_rows, tick_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def rewritten(sink_dsn: str, stream_id: str) -> int:
    """Rows the sink wrote under one query id (its batches' markers)."""
    with psycopg.connect(sink_dsn) as conn:
        found = conn.execute(
            f"SELECT coalesce(sum(rows), 0) FROM {COMMITS_TABLE}"
            " WHERE pipeline = 'undo' AND stream_id = %s AND part = -1",
            (stream_id,),
        ).fetchone()
    return int(found[0])


def test_a_bad_deploy_is_rolled_back_and_restored_to_a_restore_point(
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    shared,
    settings,
):
    table = f"undo_{uuid.uuid4().hex[:10]}"
    topic, _ = new_pipeline(
        api,
        kafka_bootstrap,
        "undo",
        restart_policy=POLICY,
        transform={"sql": "SELECT id, n FROM source"},
        sink={"connection": "warehouse", "table": table, "mode": "upsert", "key": ["id"]},
    )
    Pipeline.objects.filter(name="undo").update(placement="shared")

    def committed(each: int) -> bool:
        seen = api.get("/api/pipelines/undo/offsets/").json()["committed"]
        return seen == {topic: {"0": each, "1": each, "2": each}}

    # Record i goes to partition i % 3: an update of a key goes where its first record went.
    wave1 = [{"id": f"r{k}", "n": k} for k in range(60)]
    wave2 = [{"id": f"r{k}", "n": 1000 + k} for k in range(30)]
    wave2 += [{"id": f"r{k}", "n": k} for k in range(60, 90)]
    wave3 = [{"id": f"r{k}", "n": 2000 + k} for k in range(60, 70)]
    wave3 += [{"id": f"r{k}", "n": k} for k in range(90, 110)]
    good = {}
    for record in wave1 + wave2 + wave3:
        good[record["id"]] = record["n"]  # the good spec, never moved

    produce(kafka_bootstrap, topic, wave1)
    assert api.post("/api/pipelines/undo/start/").status_code == 202
    tick_until(
        lambda: len(sink_rows(sink_dsn, table)) == 60 and committed(20), 240, "the first wave"
    )

    # A restore point while it runs: a copy as of the last committed batch.
    response = api.post(
        "/api/pipelines/undo/restore-points/", {"reason": "before the deploy"}, format="json"
    )
    assert response.status_code == 201, response.json()
    point = response.json()
    assert point["offsets"] == {topic: {"0": 20, "1": 20, "2": 20}}
    assert point["spec_version"] == 1

    produce(kafka_bootstrap, topic, wave2)
    tick_until(lambda: committed(40), 120, "the second wave")

    # The bad deploy: a new version that writes the numbers negated.
    spec = {"transform": {"sql": "SELECT id, -n AS n FROM source"}}
    assert api.patch("/api/pipelines/undo/", {"spec": spec}, format="json").status_code == 200
    assert api.post("/api/pipelines/undo/restart/", {"reason": "deploy"}).status_code == 202
    tick_until(
        lambda: current("undo").spec_version == 2 and current("undo").state == RunState.RUNNING,
        120,
        "version 2 running",
    )
    before_change = RestorePoint.objects.get(pipeline_name="undo", kind="before-change")
    assert before_change.spec_version == 1
    assert before_change.offsets == {topic: {"0": 40, "1": 40, "2": 40}}
    produce(kafka_bootstrap, topic, wave3)
    tick_until(lambda: committed(50), 120, "the third wave, by version 2")
    assert sink_rows(sink_dsn, table)["r100"] == -100  # the damage

    # Undo: stop, roll back to version 1, restore the restore point, start.
    assert api.post("/api/pipelines/undo/stop/").status_code == 202
    tick_until(lambda: current("undo").state == RunState.EXITED, 120, "the stop")
    rolled = api.post("/api/pipelines/undo/rollback/", {"version": 1}, format="json")
    assert rolled.status_code == 200, rolled.json()
    body = {"restore_point": point["id"], "reason": "undo the deploy"}
    restored = api.post("/api/pipelines/undo/restore/", body, format="json")
    assert restored.status_code == 200, restored.json()
    new_id = restored.json()["query_id"]
    assert api.post("/api/pipelines/undo/start/").status_code == 202
    tick_until(
        lambda: committed(50) and sink_rows(sink_dsn, table) == good, 240, "the good spec's results"
    )
    assert current("undo").spec_version == 3  # version 1's spec, again
    assert Pipeline.objects.get(name="undo").spec["transform"]["sql"] == (
        "SELECT id, n FROM source"
    )
    # Exactly the batches after the restore point were read again: waves 2 and 3.
    checkpoint = read_checkpoint(settings.CONTROLPLANE_CHECKPOINT_ROOT / "undo")
    assert checkpoint.query_id == new_id
    assert rewritten(sink_dsn, new_id) == len(wave2) + len(wave3)
    kept = RestorePoint.objects.get(pk=restored.json()["kept_restore_point"])
    assert (kept.kind, kept.spec_version) == ("before-restore", 2)
    assert kept.offsets == {topic: {"0": 50, "1": 50, "2": 50}}
    assert AuditEntry.objects.get(action="restore").reason == "undo the deploy"
