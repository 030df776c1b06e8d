"""Kafka's internal topics, groups and client ids are off limits to an editor, through the API,
the pages and the admin; a pipeline's consumer group is its own; a redrive "to source" writes
only to the pipeline's source topics (a real broker and sink database). The name rule itself:
tests/test_kafka_names.py."""

from __future__ import annotations

import json
import re
import threading

import psycopg
import pytest
from django.db import connection as db
from django.test import Client
from django.urls import reverse
from kafka import KafkaConsumer, TopicPartition

from controlplane.accounts.roles import set_role
from controlplane.connections.models import Connection
from controlplane.definitions import services
from controlplane.definitions.models import AuditEntry, Pipeline, PipelineVersion
from jobs.sinks.postgres.store import DEAD_LETTERS_TABLE, PostgresStore
from jobs.spec import SpecError
from tests.factories import valid_spec
from tests.kafka_helpers import new_topic
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db

OWN = "are Kafka's own"


def create(api, name: str, spec: dict):
    return api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")


def source(**fields) -> dict:
    return {**valid_spec()["source"], **fields}


def kafka_sink(**fields) -> dict:
    return {"kind": "kafka", "connection": "events", "topic": "orders-out", **fields}


def test_an_editor_cannot_name_an_internal_topic_or_group_in_a_spec(api, pipeline):
    several = valid_spec(sinks=[valid_spec()["sink"], kafka_sink(topic="__transaction_state")])
    several.pop("sink")
    for spec, field in (
        (valid_spec(source=source(topics=["orders", "__consumer_offsets"])),
         "spec.source.topics[1]"),
        (valid_spec(source=source(consumer_group="__consumer_offsets")),
         "spec.source.consumer_group"),
        (valid_spec(sink=kafka_sink(topic="__consumer_offsets"), transform=None),
         "spec.sink.topic"),
        (valid_spec(sink=kafka_sink(dead_letter_topic="__transaction_state"), transform=None),
         "spec.sink.dead_letter_topic"),
        (several, "spec.sinks[1].topic"),
    ):  # fmt: skip
        response = create(api, "internal", spec)
        assert response.status_code == 400, field
        assert list(response.json()) == [field]
        assert OWN in response.json()[field][0]
        # The same through a change of the existing pipeline (PATCH merges into the spec).
        patch = {k: v for k, v in spec.items() if k in ("source", "sink", "sinks")}
        if "sinks" in patch:
            patch["sink"] = None
        response = api.patch("/api/pipelines/orders/", {"spec": patch}, format="json")
        assert response.status_code == 400, field
        assert OWN in response.json()[field][0]
    assert not Pipeline.objects.filter(name="internal").exists()
    orders = Pipeline.objects.get(name="orders")
    assert orders.version == 1 and orders.spec["source"]["topics"] == ["orders"]


def test_a_connection_cannot_take_a_client_id_kafka_keeps_for_itself(api, kafka_bootstrap):
    settings = {"bootstrap_servers": [kafka_bootstrap]}
    body = {"name": "k", "kind": "kafka", "settings": {**settings, "client_id": "__admin_client"}}
    response = api.post("/api/connections/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["settings.client_id"]
    assert (
        "__admin_client may write the broker's internal topics"
        in (response.json()["settings.client_id"][0])
    )
    assert not Connection.objects.filter(name="k").exists()
    # Nor through a change, nor by another spelling of a Kafka client property.
    body["settings"] = {**settings, "client_id": "nightly"}
    assert api.post("/api/connections/", body, format="json").status_code == 201
    for change, field in (
        ({"client_id": "__x"}, "settings.client_id"),
        ({"client_id": "a b\nc"}, "settings.client_id"),
        ({"client.id": "__admin_client"}, "settings.client.id"),
        ({"group_id": "__g"}, "settings.group_id"),
    ):
        response = api.patch(
            "/api/connections/k/", {"settings": {**settings, **change}}, format="json"
        )
        assert response.status_code == 400, change
        assert field in response.json(), response.json()
    assert Connection.objects.get(name="k").settings["client_id"] == "nightly"


@pytest.fixture
def editor(django_user_model) -> Client:
    user = django_user_model.objects.create_user(username="ed")
    set_role(user, "editor")
    client = Client()
    client.force_login(user)
    return client


def field_errors(html: str, name: str) -> str:
    match = re.search(rf'<ul class="field-errors" id="e-{re.escape(name)}">(.*?)</ul>', html, re.S)
    return match.group(1) if match else ""


def test_the_pages_refuse_them_on_their_inputs(editor, pipeline, kafka_bootstrap):
    response = editor.post(
        reverse("connection-new"),
        {"kind": "kafka", "name": "k2", "bootstrap_servers": kafka_bootstrap,
         "client_id": "__admin_client"},
    )  # fmt: skip
    assert response.status_code == 400
    assert "Kafka&#x27;s own" in field_errors(response.content.decode(), "client_id")
    assert not Connection.objects.filter(name="k2").exists()
    post = {
        "name": "payments",
        "source_connection": "events",
        "topics": "payments, __consumer_offsets",
        "schema": "id STRING",
        "starting_offsets": "earliest",
        "max_records_per_batch": "1000",
        "consumer_group": "__cp",
        "sink_connection": "warehouse",
        "table": "payments",
        "mode": "append",
        "interval_seconds": "2",
        "restart_kind": "none",
    }
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    html = response.content.decode()
    assert "&#x27;__consumer_offsets&#x27;: topics starting with __" in field_errors(html, "topics")
    assert "consumer groups starting with __" in field_errors(html, "consumer_group")
    assert not Pipeline.objects.filter(name="payments").exists()


# -- a consumer group is one pipeline's ---------------------------------------------------------


def with_group(group: str | None, **fields) -> dict:
    return valid_spec(source=source(consumer_group=group, **fields))


def test_two_pipelines_may_not_share_a_consumer_group(api, kafka_connection, postgres_connection):
    assert create(api, "first", with_group("orders-mirror")).status_code == 201
    response = create(api, "second", with_group("orders-mirror", topics=["refunds"]))
    assert response.status_code == 400
    assert list(response.json()) == ["spec.source.consumer_group"]
    assert (
        "'orders-mirror' is the consumer group of pipeline 'first' already"
        in (response.json()["spec.source.consumer_group"][0])
    )
    assert not Pipeline.objects.filter(name="second").exists()
    # Case matters to Kafka; no group at all is never in the way.
    assert create(api, "second", with_group("Orders-Mirror")).status_code == 201
    assert create(api, "third", with_group(None)).status_code == 201
    assert create(api, "fourth", with_group(None)).status_code == 201
    # A change onto another pipeline's group: refused, nothing stored.
    response = api.patch(
        "/api/pipelines/third/",
        {"spec": {"source": {"consumer_group": "orders-mirror"}}},
        format="json",
    )
    assert response.status_code == 400
    assert "pipeline 'first'" in response.json()["spec.source.consumer_group"][0]
    third = Pipeline.objects.get(name="third")
    assert third.version == 1 and third.spec["source"]["consumer_group"] is None
    # PUT too.
    response = api.put(
        "/api/pipelines/third/",
        {"name": "third", "spec": with_group("Orders-Mirror"), "version": 1},
        format="json",
    )
    assert response.status_code == 400
    assert "pipeline 'second'" in response.json()["spec.source.consumer_group"][0]
    # A pipeline's own group is not in its way.
    response = api.patch(
        "/api/pipelines/first/", {"spec": {"trigger": {"interval_seconds": 9}}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert Pipeline.objects.get(name="first").spec["source"]["consumer_group"] == "orders-mirror"


def test_a_rollback_onto_a_group_another_pipeline_took_is_refused(
    api, kafka_connection, postgres_connection
):
    assert create(api, "first", with_group("g1")).status_code == 201
    assert create(api, "second", with_group("g2")).status_code == 201
    # first leaves g1 for g3, second takes g1: first's version 1 cannot come back.
    for name, group in (("first", "g3"), ("second", "g1")):
        response = api.patch(
            f"/api/pipelines/{name}/",
            {"spec": {"source": {"consumer_group": group}}},
            format="json",
        )
        assert response.status_code == 200, response.json()
    response = api.post("/api/pipelines/first/rollback/", {"version": 1}, format="json")
    assert response.status_code == 400
    assert "pipeline 'second'" in response.json()["spec.source.consumer_group"][0]
    first = Pipeline.objects.get(name="first")
    assert (first.version, first.spec["source"]["consumer_group"]) == (2, "g3")


def test_the_pipeline_form_shows_a_taken_group_on_its_input(
    editor, api, kafka_connection, postgres_connection
):
    assert create(api, "first", with_group("shared")).status_code == 201
    post = {
        "name": "payments",
        "source_connection": "events",
        "topics": "payments",
        "schema": "id STRING",
        "starting_offsets": "earliest",
        "max_records_per_batch": "1000",
        "consumer_group": "shared",
        "sink_connection": "warehouse",
        "table": "payments",
        "mode": "append",
        "interval_seconds": "2",
        "restart_kind": "none",
    }
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert "of pipeline &#x27;first&#x27; already" in field_errors(
        response.content.decode(), "consumer_group"
    )
    assert not Pipeline.objects.filter(name="payments").exists()


def test_the_admin_refuses_a_taken_group(admin_client, api, kafka_connection, postgres_connection):
    assert create(api, "first", with_group("shared")).status_code == 201
    assert create(api, "second", with_group(None)).status_code == 201
    second = Pipeline.objects.get(name="second")
    form = {
        "name": "second",
        "description": "",
        "desired_state": "stopped",
        "spec": json.dumps(with_group("shared")),
        "versions-TOTAL_FORMS": "0",
        "versions-INITIAL_FORMS": "1",
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    }
    response = admin_client.post(
        f"/admin/pipelines/pipeline/{second.pk}/change/", form, follow=True
    )
    assert "of pipeline &#x27;first&#x27; already" in response.content.decode()
    second.refresh_from_db()
    assert second.version == 1 and second.spec["source"]["consumer_group"] is None
    assert not PipelineVersion.objects.filter(pipeline=second, version=2).exists()
    # Nor a new pipeline.
    form = {**form, "name": "third", "versions-INITIAL_FORMS": "0"}
    response = admin_client.post("/admin/pipelines/pipeline/add/", form, follow=True)
    assert "of pipeline &#x27;first&#x27; already" in response.content.decode()
    assert not Pipeline.objects.filter(name="third").exists()


@pytest.mark.django_db(transaction=True)
def test_two_pipelines_saved_at_once_cannot_both_take_a_group(
    api, kafka_connection, postgres_connection
):
    """The first save holds its transaction open (its group not committed yet) while the
    second checks: the second waits for it, then sees the group taken."""
    created, release, outcome = threading.Event(), threading.Event(), {}

    def first() -> None:
        try:
            from django.db import transaction

            with transaction.atomic():
                services.create_pipeline(name="first", spec_data=with_group("g"))
                created.set()
                release.wait(30)
        finally:
            db.close()

    def second() -> None:
        try:
            services.create_pipeline(name="second", spec_data=with_group("g"))
            outcome["second"] = "created"
        except SpecError as exc:
            outcome["second"] = exc.as_dict()
        finally:
            db.close()

    threads = [threading.Thread(target=first)]
    threads[0].start()
    try:
        assert created.wait(30)
        threads.append(threading.Thread(target=second))
        threads[1].start()

        def second_waits_on_the_lock() -> bool:
            with db.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname ="
                    " current_database())"
                )
                return cursor.fetchone()[0] == 1

        assert wait_for(second_waits_on_the_lock, 30), "the second save did not wait"
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert "pipeline 'first'" in outcome["second"]["source.consumer_group"][0]
    assert set(Pipeline.objects.values_list("name", flat=True)) == {"first"}


# -- redrive to source: only the pipeline's own source topics -----------------------------------


def read_values(bootstrap: str, topic: str, n: int) -> list[bytes]:
    """The first `n` record values of partition 0 (the topic's end offset says how many are
    there: see end_offset)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    got: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0)])

        def read() -> bool:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(r.value for r in records)
            return len(got) >= n

        assert wait_for(read, 30), f"{len(got)} of {n} records read from {topic}"
        return got
    finally:
        consumer.close()


def end_offset(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tp = TopicPartition(topic, 0)
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


@pytest.fixture
def redrive_pipeline(api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn):
    """Pipeline `ki-redrive` reading a real one-partition topic, with dead letters recorded
    from that topic (2), from another real topic it does not read (1), and from
    __consumer_offsets (2), as a forged row in the sink database would say."""
    mine = new_topic(kafka_bootstrap, partitions=1, prefix="ki-src")
    other = new_topic(kafka_bootstrap, partitions=1, prefix="ki-other")
    response = create(api, "ki-redrive", valid_spec(source=source(topics=[mine])))
    assert response.status_code == 201, response.json()
    sink = PostgresStore({"conninfo": sink_dsn}, pipeline="ki-redrive", table="orders_dl_target")
    sink.ensure_tables([])
    rows = [
        (mine, 0, 10, b'{"id": "a"}'),
        (mine, 0, 11, b'{"id": "b"}'),
        (other, 0, 5, b'{"id": "other"}'),
        ("__consumer_offsets", 3, 7, b"\x00\x01forged"),
        ("__consumer_offsets", 4, 8, b"\x00\x01forged"),
    ]
    with psycopg.connect(sink_dsn, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.executemany(
            f'INSERT INTO "{DEAD_LETTERS_TABLE}" (pipeline, batch_id, topic, partition,'
            ' "offset", raw, error, record_time, received_at)'
            " VALUES ('ki-redrive', 1, %s, %s, %s, %s, 'does not parse', now(), now())",
            rows,
        )
    yield mine, other
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s', ["ki-redrive"])


def letters_left(sink_dsn) -> list[tuple[str, int]]:
    with psycopg.connect(sink_dsn) as conn:
        return conn.execute(
            f'SELECT topic, "offset" FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s'
            ' ORDER BY "offset"',
            ["ki-redrive"],
        ).fetchall()


@pytest.mark.kafka
def test_a_redrive_to_source_writes_only_to_the_pipeline_s_source_topics(
    api, redrive_pipeline, kafka_bootstrap, sink_dsn
):
    mine, other = redrive_pipeline
    url = "/api/pipelines/ki-redrive/dead-letters/redrive/"
    before = letters_left(sink_dsn)
    assert len(before) == 5
    response = api.post(url, {"to": "source", "reason": "fixed"}, format="json")
    assert response.status_code == 400, response.json()
    message = response.json()["to"][0]
    assert "letters recorded from topics this pipeline does not read" in message
    assert f"'__consumer_offsets' (2 letters), '{other}' (1 letter)" in message
    assert f"source.topics ('{mine}')" in message
    # Nothing written anywhere, nothing removed, no redrive audited.
    assert end_offset(kafka_bootstrap, mine) == 0 and end_offset(kafka_bootstrap, other) == 0
    assert letters_left(sink_dsn) == before
    assert not AuditEntry.objects.filter(action="dead-letters-redrive").exists()
    # Nor to Kafka's own topics by name.
    response = api.post(url, {"to": "__consumer_offsets"}, format="json")
    assert response.status_code == 400
    assert OWN in response.json()["to"][0]
    assert letters_left(sink_dsn) == before
    # The pipeline's own letters, chosen by the topic filter, go back to its source topic.
    body = {"to": "source", "filters": {"topic": mine}, "reason": "fixed"}
    response = api.post(url, body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["redriven"] == 2
    assert end_offset(kafka_bootstrap, mine) == 2
    assert sorted(read_values(kafka_bootstrap, mine, 2)) == [b'{"id": "a"}', b'{"id": "b"}']
    assert end_offset(kafka_bootstrap, other) == 0
    assert letters_left(sink_dsn) == [
        (other, 5),
        ("__consumer_offsets", 7),
        ("__consumer_offsets", 8),
    ]


@pytest.mark.kafka
def test_the_page_reports_a_refused_redrive(
    redrive_pipeline, django_user_model, client, kafka_bootstrap, sink_dsn
):
    mine, other = redrive_pipeline
    user = django_user_model.objects.create_user(username="ops-ki")
    set_role(user, "operator")
    client.force_login(user)
    form = {"target": "source", "confirm": "ki-redrive"}
    done = client.post(
        reverse("pipeline-dead-letters-redrive", args=["ki-redrive"]), form, follow=True
    )
    page = done.content.decode()
    assert "Not redriven: to: letters recorded from topics this pipeline does not read" in page
    assert end_offset(kafka_bootstrap, mine) == 0 and end_offset(kafka_bootstrap, other) == 0
    assert len(letters_left(sink_dsn)) == 5
