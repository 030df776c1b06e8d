"""Resetting a stopped pipeline's offsets, with real Spark (a member of a shared application,
so that its restart is warm): refused while it runs; reset to a time, its next run reads
exactly the records from that time on (an append sink shows each of them twice, the others
once); the old checkpoint is kept; the API says what was committed and what is pending."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from controlplane.definitions.models import AuditEntry, Pipeline, RunState
from tests.kafka_helpers import produce
from tests.runs import POLICY, current, new_pipeline, tick_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def rows(sink_dsn: str, table: str) -> dict[int, int]:
    try:
        with psycopg.connect(sink_dsn) as conn:
            found = conn.execute(f'SELECT n, count(*) FROM "{table}" GROUP BY n').fetchall()
    except psycopg.errors.UndefinedTable:
        return {}  # not created yet
    return dict(found)


def test_a_reset_to_a_time_reads_exactly_the_records_from_then_on(
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    shared,
):
    topic, table = new_pipeline(api, kafka_bootstrap, "rewind", restart_policy=POLICY)
    Pipeline.objects.filter(name="rewind").update(placement="shared")
    t0 = int(time.time() * 1000) - 600_000  # ten minutes ago, one record a second
    produce(kafka_bootstrap, topic, ({"id": f"r{i}", "n": i} for i in range(90)),
            timestamp=lambda i: t0 + i * 1000)  # fmt: skip
    assert api.post("/api/pipelines/rewind/start/").status_code == 202
    tick_until(lambda: sum(rows(sink_dsn, table).values()) == 90, 240, "the first 90 rows")
    # The rows are in; the checkpoint's commit of their batch follows (a stop before it would
    # leave the batch to be read again, exactly once, by the next run).
    tick_until(
        lambda: (
            api.get("/api/pipelines/rewind/offsets/").json()["committed"]
            == {topic: {"0": 30, "1": 30, "2": 30}}
        ),
        60,
        "the batch committed in the checkpoint",
    )

    # Refused while it runs, saying why.
    body = {"to": {"timestamp": "2026-01-01T00:00:00Z"}, "reason": "replay"}
    response = api.post("/api/pipelines/rewind/offsets/reset/", body, format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == "pipeline 'rewind' is wanted running: stop it first"

    assert api.post("/api/pipelines/rewind/stop/").status_code == 202
    tick_until(lambda: current("rewind").state == RunState.EXITED, 120, "the stop")
    seen = api.get("/api/pipelines/rewind/offsets/").json()
    assert seen["committed"] == {topic: {"0": 30, "1": 30, "2": 30}}
    assert seen["pending_reset"] is None

    # Records i go to partition i % 3 at offset i // 3: from record 60 on, offset 20 each.
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime((t0 + 60_000) / 1000)) + ".000Z"
    body = {"to": {"timestamp": at}, "reason": "reprocess after the fix"}
    response = api.post("/api/pipelines/rewind/offsets/reset/", body, format="json")
    assert response.status_code == 200, response.json()
    done = response.json()
    assert done["start"] == {topic: {"0": 20, "1": 20, "2": 20}}
    assert Path(done["kept_checkpoint"], "commits").is_dir()  # the old one, kept
    entry = AuditEntry.objects.get(action="offsets-reset")
    assert entry.reason == "reprocess after the fix"
    assert entry.before["committed"] == {topic: {"0": 30, "1": 30, "2": 30}}
    assert api.get("/api/pipelines/rewind/offsets/").json()["pending_reset"] == done["start"]

    assert api.post("/api/pipelines/rewind/start/").status_code == 202
    tick_until(lambda: sum(rows(sink_dsn, table).values()) == 120, 240, "the reprocessed rows")
    counts = rows(sink_dsn, table)
    assert {n: c for n, c in counts.items() if c != 1} == {n: 2 for n in range(60, 90)}
    assert sorted(counts) == list(range(90))
    # The new checkpoint's commit of the batch follows its rows.
    tick_until(
        lambda: (
            api.get("/api/pipelines/rewind/offsets/").json()["committed"]
            == {topic: {"0": 30, "1": 30, "2": 30}}
        ),
        60,
        "the batch committed in the new checkpoint",
    )
    # The new checkpoint holds its start: the reset is done.
    assert api.get("/api/pipelines/rewind/offsets/").json()["pending_reset"] is None


def test_bad_targets_are_refused_naming_the_field(api, pipeline):
    for to, problem in (
        ("yesterday", 'must be "earliest", "latest"'),
        ({"timestamp": "noon"}, "timestamp 'noon' is not an ISO 8601 time"),
        ({"timestamp": "2026-11-23T10:00:00"}, "has no time zone"),
    ):
        response = api.post("/api/pipelines/orders/offsets/reset/", {"to": to}, format="json")
        assert response.status_code == 400, (to, response.json())
        assert problem in response.json()["to"][0]


def test_the_pipeline_page_shows_the_offsets_and_resets_them(
    api, client, django_user_model, pipeline, kafka_bootstrap, settings, tmp_path
):
    import json as _json

    from controlplane.accounts.roles import set_role
    from controlplane.definitions.models import DesiredState
    from tests.kafka_helpers import new_topic

    topic = new_topic(kafka_bootstrap, partitions=2)
    produce(
        kafka_bootstrap, topic, ({"id": f"r{i}", "amount": 1.0} for i in range(6)), partitions=2
    )
    spec = {"source": {"topics": [topic]}}
    assert api.patch("/api/pipelines/orders/", {"spec": spec}, format="json").status_code == 200
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path
    (tmp_path / "orders" / "offsets").mkdir(parents=True)
    (tmp_path / "orders" / "commits").mkdir()
    offsets = {topic: {"0": 2, "1": 3}}
    (tmp_path / "orders" / "offsets" / "0").write_text(f"v1\n{{}}\n{_json.dumps(offsets)}\n")
    (tmp_path / "orders" / "commits" / "0").write_text("v1\n{}\n")
    user = django_user_model.objects.create_user(username="ops-offsets")
    set_role(user, "operator")
    client.force_login(user)
    page = client.get("/pipelines/orders/").content.decode()
    assert f"<code data-committed-offsets>{topic}/0: 2 · {topic}/1: 3</code>" in page

    form = {"to": "earliest", "reason": "replay all", "confirm": "orders"}
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.RUNNING)
    text = client.post("/pipelines/orders/offsets/reset", form, follow=True).content.decode()
    assert "Not reset: pipeline &#x27;orders&#x27; is wanted running: stop it first." in text
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.STOPPED)
    bad = {**form, "to": "offsets", "offsets": "{not json"}
    text = client.post("/pipelines/orders/offsets/reset", bad, follow=True).content.decode()
    assert "Not reset: offsets must be JSON" in text
    text = client.post("/pipelines/orders/offsets/reset", form, follow=True).content.decode()
    assert f"orders starts at {topic}/0: 0 · {topic}/1: 0 when it is next started." in text
    assert "A reset is waiting for the next start" in text
    assert AuditEntry.objects.get(action="offsets-reset").reason == "replay all"
