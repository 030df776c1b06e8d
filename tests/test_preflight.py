"""Preflight against the real Kafka and Postgres (controlplane.definitions.preflight): each
check reported at its field; a system that cannot be reached is a warning, never a block;
nothing is written; saving from the form and starting refuse a definition it finds wrong
unless told to go on."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.urls import reverse

from controlplane.definitions import preflight
from controlplane.definitions.models import Pipeline
from tests.factories import valid_spec
from tests.kafka_helpers import new_topic

pytestmark = [pytest.mark.kafka, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _refuse(settings):
    settings.CONTROLPLANE_PREFLIGHT = "refuse"  # the production default
    settings.CONTROLPLANE_PREFLIGHT_TIMEOUT = 3


@pytest.fixture
def table(sink_dsn):
    """A fresh table name in the sink database; dropped at the end."""
    name = f"pf_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'DROP TABLE IF EXISTS "{name}"')


def sql(dsn: str, statement: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def source(topic: str) -> dict:
    return {
        "connection": "events",
        "topics": [topic],
        "schema": "id STRING, n INT, ts TIMESTAMP",
        "starting_offsets": "earliest",
    }


def spec(topic: str, table: str, **sink) -> dict:
    """From `topic` into the Postgres `table`, without a transform."""
    return valid_spec(
        source=source(topic),
        transform=None,
        sink={"connection": "warehouse", "table": table, **sink},
    )


def draft(api, body: dict) -> dict:
    response = api.post("/api/pipelines/preflight/", {"spec": body}, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def checks(report: dict, field: str) -> list[tuple[str, str]]:
    return [(c["status"], c["message"]) for c in report["checks"] if c["field"] == field]


def test_a_definition_that_fits_its_systems_passes(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, table
):
    topic = new_topic(kafka_bootstrap)
    report = draft(api, spec(topic, table, mode="upsert", key=["id"]))
    assert report["ok"] and report["errors"] == {}, report
    [(status, said)] = checks(report, "source.topics[0]")
    assert status == "ok" and "3 partition(s) and can be read" in said
    [(status, said)] = checks(report, "sink.table")
    assert status == "ok" and "does not exist: the pipeline creates it" in said
    # Nothing was written: the table is still not there.
    with psycopg.connect(sink_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None
    # An existing table that fits, with its unique key.
    sql(sink_dsn, f'CREATE TABLE "{table}" (id text PRIMARY KEY, n bigint, ts timestamptz)')
    report = draft(api, spec(topic, table, mode="upsert", key=["id"]))
    assert report["ok"], report
    assert ("ok", "a unique key on (id)") in checks(report, "sink.key")


def test_a_missing_source_topic_is_an_error_at_its_field(
    api, kafka_connection, postgres_connection, kafka_bootstrap, table
):
    topic = new_topic(kafka_bootstrap)
    body = spec(topic, table)
    body["source"]["topics"] = [topic, "no-such-topic-7c1"]
    report = draft(api, body)
    assert not report["ok"]
    assert list(report["errors"]) == ["source.topics[1]"]
    assert "topic 'no-such-topic-7c1' does not exist" in report["errors"]["source.topics[1]"][0]
    assert checks(report, "source.topics[0]")[0][0] == "ok"


def test_a_table_column_that_cannot_take_the_output_is_an_error(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, table
):
    """The type mismatch that made a pipeline restart forever: n is an int, the existing
    column a timestamptz. Also: a column the output lacks that must be filled, and one the
    table lacks."""
    topic = new_topic(kafka_bootstrap)
    sql(sink_dsn, f'CREATE TABLE "{table}" (id text, n timestamptz, ts timestamptz)')
    report = draft(api, spec(topic, table))
    [message] = report["errors"]["sink.table"]
    assert "column 'n' is timestamp with time zone, which cannot take the output's int" in message
    sql(sink_dsn, f'ALTER TABLE "{table}" DROP COLUMN n, ADD COLUMN region text NOT NULL')
    [message] = draft(api, spec(topic, table))["errors"]["sink.table"]
    assert "has no column 'n', which the output has" in message
    assert "column 'region' is NOT NULL without a default" in message
    # A string column takes anything; a wider integer takes an int.
    sql(sink_dsn, f'ALTER TABLE "{table}" DROP COLUMN region, ADD COLUMN n text')
    assert draft(api, spec(topic, table))["ok"]


def test_an_upsert_needs_its_key_in_the_output_and_a_unique_key_in_the_table(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, table
):
    topic = new_topic(kafka_bootstrap)
    sql(sink_dsn, f'CREATE TABLE "{table}" (id text, n int, ts timestamptz)')
    report = draft(api, spec(topic, table, mode="upsert", key=["id"]))
    [message] = report["errors"]["sink.key"]
    assert "no primary key or unique index on exactly (id)" in message
    # A key the table lacks (the transform hides its output, so validation let it through).
    body = spec(topic, table, mode="upsert", key=["courier_id"])
    body["transform"] = {"sql": "SELECT inline(array(struct(id, n, ts))) FROM source"}
    [message] = draft(api, body)["errors"]["sink.key"]
    assert message == f"table '{table}' has no column 'courier_id', named in the key"


def test_the_user_needs_the_privileges_to_write(
    api, kafka_connection, kafka_bootstrap, sink_dsn, table
):
    role = f"pf_reader_{uuid.uuid4().hex[:6]}"
    sql(sink_dsn, f'CREATE TABLE "{table}" (id text, n int, ts timestamptz)')
    sql(sink_dsn, f"CREATE ROLE {role} LOGIN PASSWORD 'pf-secret-1'")
    try:
        sql(sink_dsn, f'GRANT SELECT ON "{table}" TO {role}')
        parts = urlsplit(sink_dsn)
        dsn = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
        response = api.post(
            "/api/connections/",
            {
                "name": "warehouse",
                "kind": "postgres",
                "settings": {"dsn": dsn},
                "secrets": {"password": "pf-secret-1"},
            },
            format="json",
        )
        assert response.status_code == 201, response.json()
        report = draft(api, spec(new_topic(kafka_bootstrap), table))
        [message] = report["errors"]["sink.table"]
        assert f"may not INSERT into '{table}'" in message
    finally:
        sql(sink_dsn, f'DROP TABLE IF EXISTS "{table}"')
        sql(sink_dsn, f"DROP ROLE IF EXISTS {role}")


def test_a_kafka_sinks_topics_must_exist(api, kafka_connection, kafka_bootstrap):
    topic = new_topic(kafka_bootstrap)
    body = valid_spec(
        source=source(topic),
        transform=None,
        sink={"kind": "kafka", "connection": "events", "topic": "absent-out-5d2"},
    )
    report = draft(api, body)
    assert "topic 'absent-out-5d2' does not exist" in report["errors"]["sink.topic"][0]
    body["sink"]["topic"] = new_topic(kafka_bootstrap)
    report = draft(api, body)
    # Its dead-letter topic (by default the topic's name + ".dead-letters") too.
    [message] = report["errors"]["sink.dead_letter_topic"]
    assert f"topic '{body['sink']['topic']}.dead-letters' does not exist" in message
    body["sink"]["dead_letter_topic"] = new_topic(kafka_bootstrap)
    report = draft(api, body)
    assert report["ok"], report


def test_a_system_that_cannot_be_reached_is_a_warning_not_a_block(api, settings, silent_address):
    """Kafka on a port nobody listens on, Postgres behind a server that never answers: each
    said as a warning within the timeout, and the preflight is ok."""
    settings.CONTROLPLANE_PREFLIGHT_TIMEOUT = 1
    for name, kind, conn_settings in (
        ("events", "kafka", {"bootstrap_servers": ["127.0.0.1:1"]}),
        (
            "warehouse",
            "postgres",
            {"dsn": f"postgresql://nobody@{silent_address}/x?sslmode=disable"},
        ),
    ):
        response = api.post(
            "/api/connections/",
            {"name": name, "kind": kind, "settings": conn_settings},
            format="json",
        )
        assert response.status_code == 201, response.json()
    report = draft(api, spec("orders", "orders_pf"))
    assert report["ok"] and report["errors"] == {}, report
    assert set(report["warnings"]) == {"source.topics[0]", "sink.table"}
    assert "Kafka (events) could not be asked in time" in report["warnings"]["source.topics[0]"][0]
    assert "Postgres (warehouse) could not be asked in time" in report["warnings"]["sink.table"][0]


def test_a_draft_that_does_not_validate_is_refused_at_its_field(api, kafka_connection):
    response = api.post(
        "/api/pipelines/preflight/", {"spec": valid_spec(trigger={"interval_seconds": -1})},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400
    assert "spec.trigger.interval_seconds" in response.json()


def test_a_start_is_refused_on_errors_unless_forced_and_warned_otherwise(
    api, settings, kafka_connection, postgres_connection, kafka_bootstrap, table
):
    body = spec("no-such-topic-91a", table)
    assert (
        api.post("/api/pipelines/", {"name": "pf", "spec": body}, format="json").status_code == 201
    )
    stored = api.post("/api/pipelines/pf/preflight/").json()
    assert list(stored["errors"]) == ["source.topics[0]"]
    response = api.post("/api/pipelines/pf/start/", {"reason": "try"}, format="json")
    assert response.status_code == 409
    assert response.json()["detail"].startswith(
        "not started: the preflight found problems (source.topics[0]: topic 'no-such-topic-91a'"
    )
    assert Pipeline.objects.get(name="pf").desired_state == "stopped"
    response = api.post("/api/pipelines/pf/start/", {"force": True}, format="json")
    assert response.status_code == 202
    assert response.json()["preflight"]["ok"] is False
    assert Pipeline.objects.get(name="pf").desired_state == "running"
    api.post("/api/pipelines/pf/stop/")
    settings.CONTROLPLANE_PREFLIGHT = "warn"
    response = api.post("/api/pipelines/pf/start/")
    assert response.status_code == 202 and response.json()["preflight"]["ok"] is False


def test_the_page_refuses_to_start_beside_the_control_and_the_form_at_the_field(
    api, django_user_model, kafka_connection, postgres_connection, kafka_bootstrap, table, editor
):
    from django.test import Client

    from controlplane.accounts.roles import set_role

    body = spec("no-such-topic-4b7", table)
    assert (
        api.post("/api/pipelines/", {"name": "pf", "spec": body}, format="json").status_code == 201
    )
    user = django_user_model.objects.create_user(username="opal")
    set_role(user, "operator")
    operator = Client()
    operator.force_login(user)
    start = reverse("pipeline-control", kwargs={"name": "pf", "action": "start"})
    form = {"reason": "go", "confirm": "pf", "where": "control-start"}
    response = operator.post(start, form)
    assert response["Location"].endswith("#control-start")
    page = operator.get(reverse("pipeline", kwargs={"name": "pf"})).content.decode()
    control = page[page.index('id="control-start"') :][:3000]
    assert "start not done: the preflight found problems: source.topics[0]" in control
    assert Pipeline.objects.get(name="pf").desired_state == "stopped"
    operator.post(start, {**form, "force": "1"})
    assert Pipeline.objects.get(name="pf").desired_state == "running"

    # The edit form: the same problem at the topics field, not saved until told.
    edit = reverse("pipeline-edit", kwargs={"name": "pf"})
    values = editor.get(edit)
    assert values.status_code == 200
    from controlplane.pages import forms

    post = forms.pipeline_values("pf", "", Pipeline.objects.get(name="pf").spec, "dedicated")
    post = {k: v for k, v in post.items() if v is not None}
    post["version"] = str(Pipeline.objects.get(name="pf").version)
    post["description"] = "changed"
    response = editor.post(edit, post)
    html = response.content.decode()
    assert response.status_code == 400
    assert "The preflight found problems" in html and "no-such-topic-4b7" in html
    assert "save even though the preflight finds problems" in html
    assert Pipeline.objects.get(name="pf").description == ""
    response = editor.post(edit, {**post, "ignore_preflight": "1"})
    assert response.status_code == 302
    assert Pipeline.objects.get(name="pf").description == "changed"


def test_every_source_and_sink_kind_has_its_checks():
    from jobs.sinks import registry
    from jobs.spec.model import KafkaSource

    assert set(preflight.SINK_CHECKS) == set(registry.names())
    assert set(preflight.SOURCE_CHECKS) == {KafkaSource.__dataclass_fields__["kind"].default}


def test_a_files_sinks_root_must_be_a_writable_directory(
    api, kafka_connection, files_connection, files_dir, kafka_bootstrap
):
    body = valid_spec(
        source=source(new_topic(kafka_bootstrap)),
        transform=None,
        sink={"kind": "files", "connection": "lake", "path": "orders/clean"},
    )
    report = draft(api, body)
    assert report["ok"], report
    assert checks(report, "sink.path") == [("ok", f"{files_dir}/lake is a writable directory")]
    (files_dir / "lake").rmdir()
    report = draft(api, body)
    assert report["errors"] == {"sink.path": [f"{files_dir}/lake does not exist"]}


def test_a_table_in_a_schema_that_does_not_exist_will_be_created(
    api, kafka_connection, postgres_connection, kafka_bootstrap
):
    schema = f"pf_{uuid.uuid4().hex[:8]}"
    report = draft(api, spec(new_topic(kafka_bootstrap), f"{schema}.orders"))
    assert report["ok"], report
    assert checks(report, "sink.table")[0][0] == "ok"
