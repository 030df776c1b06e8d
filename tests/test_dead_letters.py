"""Dead letters in the control plane, read from a real sink database's `_cp_dead_letters`
(rows as the sink writes them) and redriven to a real Kafka topic: the list with its filters
and pages, per batch and per error, the download, redrive to another topic (raw bytes and
provenance headers as produced, the letters gone from the table, audited), bad input named,
retention, the page. The pipeline end to end with Spark: test_dead_letters_spark.py."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from controlplane.definitions.models import AuditEntry
from controlplane.observability import dead_letters
from jobs.sinks.postgres.store import DEAD_LETTERS_TABLE, PostgresStore
from tests.kafka_helpers import new_topic

pytestmark = [pytest.mark.kafka, pytest.mark.django_db]

T0 = datetime(2026, 11, 23, 2, 0, tzinfo=UTC)


@pytest.fixture
def letters(pipeline, sink_dsn):
    """Ten dead letters of `orders` (and one of another pipeline): batches 1 and 2,
    partitions 0 and 1, two errors, one value not UTF-8, one empty."""
    sink = PostgresStore({"conninfo": sink_dsn}, pipeline="orders", table="orders_dl_target")
    sink.ensure_tables([])
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        # The sink database is shared by the suite's workers: only this fixture's letters
        # (topic "orders"; real pipelines' topics are named uniquely) are its to clear.
        conn.execute(f'DELETE FROM "{DEAD_LETTERS_TABLE}" WHERE topic = %s', ("orders",))
        rows = []
        for i in range(10):
            raw = f'{{"id": "x{i}", "amount": "many"}}'.encode()
            if i == 3:
                raw = b'{"id": "<b>x3</b>"}'
            if i == 7:
                raw = b"\xff\xfe not utf-8 <script>"
            if i == 8:
                raw = None
            error = "empty value (null)" if raw is None else "does not parse"
            rows.append(
                ("orders", 1 if i < 6 else 2, "orders", i % 2, 100 + i, raw, error,
                 T0 + timedelta(seconds=i), T0 + timedelta(minutes=i))
            )  # fmt: skip
        rows.append(("other", 1, "orders", 0, 5, b"x", "does not parse", T0, T0))
        with conn.cursor() as cur:
            cur.executemany(
                f'INSERT INTO "{DEAD_LETTERS_TABLE}" (pipeline, batch_id, topic, partition,'
                ' "offset", raw, error, record_time, received_at)'
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
    yield rows
    with psycopg.connect(sink_dsn, autocommit=True) as conn:  # other tests' pipeline "orders"
        conn.execute(f'DELETE FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline IN (%s, %s)',
                     ("orders", "other"))  # fmt: skip


@pytest.fixture
def operator_api(django_user_model):
    from rest_framework.test import APIClient

    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username="ops")
    set_role(user, "operator")
    _, key = ApiToken.issue(user, "tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def left(sink_dsn) -> list[tuple]:
    """The fixture's letters left (topic "orders": other workers' pipelines, reading topics
    of their own, may write letters into the shared table meanwhile)."""
    with psycopg.connect(sink_dsn) as conn:
        return conn.execute(
            f'SELECT pipeline, partition, "offset" FROM "{DEAD_LETTERS_TABLE}"'
            ' WHERE topic = %s ORDER BY pipeline, "offset"',
            ("orders",),
        ).fetchall()


def test_letters_are_listed_newest_first_filtered_and_paged(operator_api, letters):
    url = "/api/pipelines/orders/dead-letters/"
    body = operator_api.get(url, {"limit": 4}).json()
    assert body["count"] == 10  # not the other pipeline's
    assert [r["offset"] for r in body["results"]] == [109, 108, 107, 106]
    odd = body["results"][2]
    assert odd["raw_text"] is None  # not UTF-8: base64 only
    assert base64.b64decode(odd["raw_base64"]) == b"\xff\xfe not utf-8 <script>"
    assert body["results"][1]["raw_base64"] is None  # an empty (null) value
    assert body["results"][3]["raw_text"] == '{"id": "x6", "amount": "many"}'
    second = operator_api.get(url, {"limit": 4, "offset": 8}).json()
    assert [r["offset"] for r in second["results"]] == [101, 100]

    def offsets(**query) -> list[int]:
        found = operator_api.get(url, query)
        assert found.status_code == 200, found.json()
        return sorted(r["offset"] for r in found.json()["results"])

    assert offsets(partition=0) == [100, 102, 104, 106, 108]
    assert offsets(batch=2) == [106, 107, 108, 109]
    assert offsets(error="empty value (null)") == [108]
    assert offsets(since="2026-11-23T02:03:00Z", until="2026-11-23T02:05:00+00:00") == [103, 104]
    assert offsets(topic="nope") == []

    for query, field, problem in (
        ({"partition": "x"}, "partition", "'x' is not a whole number"),
        ({"since": "yesterday"}, "since", "is not an ISO 8601 time with a time zone"),
        ({"until": "2026-11-23T02:00:00"}, "until", "is not an ISO 8601 time with a time zone"),
    ):
        response = operator_api.get(url, query)
        assert response.status_code == 400
        assert problem in response.json()[field][0]


def test_counts_per_batch_and_error_and_the_download(api, operator_api, letters):
    summary = api.get("/api/pipelines/orders/dead-letters/batches/").json()  # a viewer may
    assert [(b["batch_id"], b["count"]) for b in summary["batches"]] == [(2, 4), (1, 6)]
    assert summary["errors"] == [
        {"error": "does not parse", "count": 9},
        {"error": "empty value (null)", "count": 1},
    ]
    response = operator_api.get("/api/pipelines/orders/dead-letters/download/", {"batch": 1})
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="orders-dead-letters.jsonl"'
    lines = [json.loads(line) for line in b"".join(response.streaming_content).splitlines()]
    assert [line["offset"] for line in lines] == [100, 101, 102, 103, 104, 105]  # oldest first
    assert lines[0]["raw_text"] == '{"id": "x0", "amount": "many"}'
    assert lines[0]["received_at"] == "2026-11-23T02:00:00+00:00"


def test_a_redrive_to_another_topic_moves_the_letters_there(
    operator_api, letters, kafka_bootstrap, sink_dsn
):
    retry = new_topic(kafka_bootstrap, partitions=1)
    body = {"to": retry, "filters": {"batch": 2}, "reason": "schema fixed in v4"}
    response = operator_api.post("/api/pipelines/orders/dead-letters/redrive/", body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "redriven": 4,
        "failed": 0,
        "remaining": 0,
        "to": retry,
        "error": None,
    }
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000
    )
    consumer.assign([TopicPartition(retry, 0)])
    got = list(consumer)
    consumer.close()
    assert sorted(r.value for r in got) == sorted(
        [b'{"id": "x6", "amount": "many"}', b"\xff\xfe not utf-8 <script>", b"",
         b'{"id": "x9", "amount": "many"}']
    )  # fmt: skip
    headers = {dict(r.headers)["cp-redriven-from"] for r in got}
    assert headers == {b"orders/0/106", b"orders/1/107", b"orders/0/108", b"orders/1/109"}
    assert {dict(r.headers)["cp-pipeline"] for r in got} == {b"orders"}
    assert [o for p, _, o in left(sink_dsn) if p == "orders"] == list(range(100, 106))
    entry = AuditEntry.objects.get(action="dead-letters-redrive")
    assert entry.reason == "schema fixed in v4"
    assert entry.before == {"filters": {"batch": 2}}
    assert entry.after["redriven"] == 4


def test_a_redrive_names_what_is_wrong(operator_api, letters, sink_dsn):
    url = "/api/pipelines/orders/dead-letters/redrive/"
    for body, field, problem in (
        ({"to": "bad topic!"}, "topic", "'bad topic!' is not a Kafka topic name"),
        ({"to": f"missing-{uuid.uuid4().hex[:8]}"}, "to", "does not exist on the source"),
        ({"to": "source"}, "to", "topic 'orders' does not exist on the source cluster"),
        ({"to": "source", "filters": {"batch": "two"}}, "batch", "'two' is not a whole number"),
        ({}, "to", "This field is required."),
    ):
        response = operator_api.post(url, body, format="json")
        assert response.status_code == 400, response.json()
        assert problem in response.json()[field][0]
    assert len(left(sink_dsn)) == 11  # nothing moved


def test_old_letters_are_purged_and_counts_are_exact(pipeline, letters, sink_dsn, settings):
    from controlplane.definitions.models import Pipeline

    orders = Pipeline.objects.get(name="orders")
    assert dead_letters.counts([orders]) == {
        orders.pk: {"count": 10, "last_at": "2026-11-23T02:09:00+00:00"}
    }
    settings.CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS = 1
    # A day after 02:05: the letters received before 02:05 go (only this control plane's
    # pipelines: `other` is not one of them).
    assert dead_letters.purge(T0 + timedelta(days=1, minutes=5)) == 5
    assert [o for p, _, o in left(sink_dsn) if p == "orders"] == list(range(105, 110))
    assert ("other", 0, 5) in left(sink_dsn)
    assert dead_letters.counts([orders])[orders.pk]["count"] == 5


def test_the_page_shows_raw_values_safely_and_redrives(
    client, django_user_model, letters, kafka_bootstrap, sink_dsn
):
    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username="ops-page")
    set_role(user, "operator")
    client.force_login(user)
    page = client.get("/pipelines/orders/dead-letters", {"partition": "1"}).content.decode()
    assert "<strong data-dead-letters-total>5</strong> match" in page
    assert "{&quot;id&quot;: &quot;&lt;b&gt;x3&lt;/b&gt;&quot;}" in page  # escaped
    assert "ff fe 20 6e 6f 74" in page  # not UTF-8: shown in hex
    assert "{&quot;id&quot;: &quot;x1&quot;, &quot;amount&quot;: &quot;many&quot;}" in page
    assert 'data-dead-letter="orders/0/100"' not in page  # partition 0: filtered out
    assert "/api/pipelines/orders/dead-letters/download/?partition=1" in page
    bad = client.get("/pipelines/orders/dead-letters", {"batch": "x"}).content.decode()
    assert "batch: &#x27;x&#x27; is not a whole number" in bad

    retry = new_topic(kafka_bootstrap, partitions=1)
    form = {"partition": "1", "target": "topic", "topic_to": retry, "confirm": "orders"}
    done = client.post("/pipelines/orders/dead-letters/redrive", form, follow=True)
    assert f"5 dead letters written again to topic {retry}." in done.content.decode()
    assert [o for p, _, o in left(sink_dsn) if p == "orders"] == [100, 102, 104, 106, 108]


def test_one_redrive_of_a_pipeline_at_a_time(operator_api, letters, sink_dsn):
    with psycopg.connect(sink_dsn, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('cp-redrive:orders'))")
        body = {"to": "source", "reason": "twice"}
        response = operator_api.post(
            "/api/pipelines/orders/dead-letters/redrive/", body, format="json"
        )
        assert response.status_code == 409
        assert response.json()["detail"] == (
            "a redrive of pipeline 'orders' is running: try again after it"
        )
    assert len(left(sink_dsn)) == 11
    assert not AuditEntry.objects.filter(action="dead-letters-redrive").exists()


def test_a_deleted_pipelines_letters_are_purged_too(api, letters, sink_dsn, settings):
    from controlplane.definitions.models import DesiredState, Pipeline

    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.STOPPED)
    assert api.delete("/api/pipelines/orders/").status_code == 204
    settings.CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS = 1
    assert dead_letters.purge(T0 + timedelta(days=2)) == 10
    assert left(sink_dsn) == [("other", 0, 5)]  # not this control plane's


def test_a_kafka_sink_s_dead_letters_are_in_its_topic_and_the_api_says_so(
    api, operator_api, kafka_connection
):
    spec = {
        "source": {"connection": "events", "topics": ["orders"], "schema": "id STRING"},
        "sink": {"kind": "kafka", "connection": "events", "topic": "orders-out"},
    }
    created = api.post("/api/pipelines/", {"name": "k", "spec": spec}, format="json")
    assert created.status_code == 201, created.json()
    base = "/api/pipelines/k/dead-letters/"
    for response in (
        operator_api.get(base),
        operator_api.get(base + "batches/"),
        operator_api.get(base + "download/"),
        operator_api.post(base + "redrive/", {"to": "source"}, format="json"),
    ):
        assert response.status_code == 409
        assert "'orders-out.dead-letters'" in response.json()["detail"]
    from controlplane.definitions.models import Pipeline

    assert dead_letters.counts(list(Pipeline.objects.filter(name="k"))) == {}


def test_a_files_sink_s_dead_letters_are_files_and_the_api_and_pages_say_where(
    api, operator_api, client, kafka_connection, files_connection, files_dir
):
    from django.urls import reverse

    from controlplane.definitions.models import Pipeline
    from tests.factories import files_spec

    created = api.post("/api/pipelines/", {"name": "f", "spec": files_spec("out")}, format="json")
    assert created.status_code == 201, created.json()
    where = f"file://{files_dir}/lake/out/_cp_dead_letters/"
    base = "/api/pipelines/f/dead-letters/"
    for response in (
        operator_api.get(base),
        operator_api.get(base + "batches/"),
        operator_api.get(base + "download/"),
        operator_api.post(base + "redrive/", {"to": "source"}, format="json"),
    ):
        assert response.status_code == 409
        assert f"JSON Lines files under {where}" in response.json()["detail"]
    assert dead_letters.counts(list(Pipeline.objects.filter(name="f"))) == {}
    client.force_login(Pipeline.objects.get(name="f").created_by)
    page = client.get(reverse("pipeline", args=["f"])).content.decode()
    assert f"JSON Lines files under <code>{where}</code>" in page
    assert "browse, download, redrive" not in page
    page = client.get(reverse("pipeline-dead-letters", args=["f"])).content.decode()
    assert where in page
