"""Editing pipelines and connections in the browser: form <-> spec, problems next to their
fields, versions as preconditions, secrets never sent back."""

from __future__ import annotations

import pytest
from django.urls import reverse

from controlplane.connections.models import Connection
from controlplane.definitions.models import AuditEntry, Pipeline
from controlplane.pages import forms
from jobs.spec import parse_spec
from tests.clients import field_errors, form_for, new_pipeline_post
from tests.factories import valid_spec

# -- pure: forms ------------------------------------------------------------------------------


def test_a_stored_spec_survives_the_round_trip_through_the_form():
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    parsed = forms.pipeline_from_form(form_for(spec), spec)
    assert parsed.errors == {}
    assert parse_spec(parsed.data["spec"], connections=known).to_dict() == spec


def test_text_inputs_become_lists_numbers_json_and_a_policy_of_the_chosen_kind():
    post = {
        "topics": " a, b ,,c ",
        "max_records_per_batch": "500",
        "starting_offsets": '{"timestamp": "2026-11-21T10:00:00Z"}',
        "restart_kind": "failure-rate",
        "restart_failure-rate_max_failures": "3",
        "restart_fixed-delay_attempts": "9",  # another kind's field: ignored
        "transform_sql": "   ",
    }
    spec = forms.pipeline_from_form(post, {"transform": {"sql": "SELECT 1"}}).data["spec"]
    assert spec["source"]["topics"] == ["a", "b", "c"]
    assert spec["source"]["max_records_per_batch"] == 500
    assert spec["source"]["starting_offsets"] == {"timestamp": "2026-11-21T10:00:00Z"}
    assert spec["restart_policy"] == {"kind": "failure-rate", "max_failures": 3}
    assert "transform" not in spec  # emptied: no transform


def test_inputs_that_are_not_what_they_should_be_are_reported_on_the_input():
    parsed = forms.pipeline_from_form(
        {"max_records_per_batch": "lots", "starting_offsets": "{oops"}, None
    )
    assert set(parsed.errors) == {"max_records_per_batch", "starting_offsets"}
    assert "'lots' is not a number" in parsed.errors["max_records_per_batch"][0]


def test_problems_are_placed_next_to_the_input_they_concern():
    placed = forms.place_errors(
        {
            "spec.source.topics[1]": ["'bad topic' is not a valid topic name"],
            "spec.sink.key": ["is required for upsert"],
            "spec.restart_policy.delay_seconds": ["must be at most 604800"],
            "spec.source": ["unknown field 'colour'"],
            "spec": ["must be an object"],
        },
        forms.PIPELINE_FIELDS,
        group="fixed-delay",
    )
    assert placed["topics"] == ["source.topics[1]: 'bad topic' is not a valid topic name"]
    assert placed["key"] == ["is required for upsert"]
    assert placed["restart_fixed-delay_delay_seconds"] == ["must be at most 604800"]
    assert placed[forms.GENERAL] == [
        "spec.source: unknown field 'colour'",
        "spec: must be an object",
    ]


def test_a_connection_form_keeps_secrets_out_of_what_is_shown_again():
    post = {
        "name": "k",
        "bootstrap_servers": "a:1",
        "sasl_password": "hunter2",
        "ssl_password": "x",
    }
    parsed = forms.connection_from_form(post, "kafka")
    assert parsed.data["secrets"] == {"sasl_password": "hunter2", "ssl_password": "x"}
    assert parsed.data["settings"] == {"bootstrap_servers": ["a:1"]}
    assert "hunter2" not in str(forms.without_secrets(post))
    removed = forms.connection_from_form({"remove_password": "on"}, "postgres")
    assert removed.data["secrets"] == {"password": None}


# -- pages --------------------------------------------------------------------------------------


def test_an_editor_creates_a_pipeline_from_the_form(editor, kafka_connection, postgres_connection):
    page = editor.get(reverse("pipeline-new")).content.decode()
    assert '<option value="events">' in page and '<option value="warehouse">' in page
    response = editor.post(reverse("pipeline-new"), new_pipeline_post())
    assert response.status_code == 302
    assert response["Location"] == reverse("pipeline", kwargs={"name": "payments"})
    created = Pipeline.objects.get(name="payments")
    assert (created.version, created.desired_state, created.description) == (
        1,
        "stopped",
        "card payments",
    )
    assert created.spec["source"]["topics"] == ["payments"]
    assert created.spec["restart_policy"]["attempts"] == 4
    assert created.spec["restart_policy"]["delay_seconds"] == 1  # the policy's default


def test_a_bad_pipeline_form_shows_each_problem_at_its_field_and_keeps_the_input(
    editor, kafka_connection, postgres_connection
):
    post = new_pipeline_post(
        name="Bad Name!",
        topics="ok, not a topic",
        schema="id STRNG",
        mode="upsert",  # without key columns
        max_records_per_batch="0",
        transform_sql="SELECT nope FROM source",
    )
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    html = response.content.decode()
    assert "lower-case letters" in field_errors(html, "name")
    assert Pipeline.objects.filter(name="payments").count() == 0
    # The name is checked first; with a good one the spec's problems show, each at its input.
    response = editor.post(reverse("pipeline-new"), {**post, "name": "payments"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "not a topic" in field_errors(html, "topics")
    assert field_errors(html, "schema")
    assert field_errors(html, "key") or field_errors(html, "mode")
    assert field_errors(html, "max_records_per_batch")
    assert 'value="ok, not a topic"' in html  # what was typed is still there
    assert "SELECT nope FROM source</textarea>" in html
    assert not Pipeline.objects.filter(name="payments").exists()


def test_editing_makes_a_new_version_and_a_stale_form_does_not_overwrite(editor, pipeline):
    form = editor.get(reverse("pipeline-edit", kwargs={"name": "orders"})).content.decode()
    assert 'name="version" value="1"' in form
    stored = Pipeline.objects.get(name="orders")
    post = {
        **form_for(stored.spec, transform_sql="SELECT id, amount, ts FROM source"),
        "version": "1",
        "description": "edited",
    }
    post.pop("name")
    response = editor.post(reverse("pipeline-edit", kwargs={"name": "orders"}), post)
    assert response.status_code == 302, response.content.decode()[:2000]
    stored.refresh_from_db()
    assert (stored.version, stored.description) == (2, "edited")
    assert stored.spec["transform"]["sql"] == "SELECT id, amount, ts FROM source"
    # The same form again (made from version 1): refused, nothing written, input kept.
    post["transform_sql"] = "SELECT id FROM source"
    response = editor.post(reverse("pipeline-edit", kwargs={"name": "orders"}), post)
    assert response.status_code == 409
    assert "is at version 2, not 1" in response.content.decode()
    assert "SELECT id FROM source</textarea>" in response.content.decode()
    stored.refresh_from_db()
    assert stored.version == 2


def test_connections_are_listed_without_their_secrets(editor, db):
    editor.post(
        reverse("connection-new"),
        {"kind": "postgres", "name": "dw", "dsn": "postgresql://app:s3cret-pw@db:5432/dw"},
    )
    stored = Connection.objects.get(name="dw")
    assert stored.settings == {"dsn": "postgresql://app@db:5432/dw"}
    assert stored.get_secrets() == {"password": "s3cret-pw"}
    page = editor.get(reverse("connections")).content.decode()
    assert "dw" in page and "password" in page and "s3cret-pw" not in page
    form = editor.get(reverse("connection-edit", kwargs={"name": "dw"})).content.decode()
    assert "s3cret-pw" not in form and "set — leave empty to keep it" in form


def test_a_bad_connection_form_names_the_field_and_never_echoes_a_password(editor, db):
    response = editor.post(
        reverse("connection-new"),
        {
            "kind": "kafka",
            "name": "broker",
            "bootstrap_servers": "good:9092, no-port",
            "security_protocol": "SASL_SSL",
            "sasl_password": "typed-secret-123",
        },
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "no-port" in field_errors(html, "bootstrap_servers")
    assert "required" in field_errors(html, "sasl_mechanism")
    assert "typed-secret-123" not in html
    assert 'value="good:9092, no-port"' in html
    assert not Connection.objects.filter(name="broker").exists()


def test_saving_a_connection_without_typing_its_password_keeps_it(editor, db):
    editor.post(
        reverse("connection-new"),
        {"kind": "postgres", "name": "dw", "dsn": "postgresql://app@db:5432/dw", "password": "pw1"},
    )
    url = reverse("connection-edit", kwargs={"name": "dw"})
    response = editor.post(url, {"dsn": "postgresql://app@db:5432/dw", "description": "same"})
    assert response.status_code == 302
    stored = Connection.objects.get(name="dw")
    assert (stored.description, stored.get_secrets()) == ("same", {"password": "pw1"})
    editor.post(url, {"dsn": "postgresql://app@db:5432/dw", "remove_password": "on"})
    assert Connection.objects.get(name="dw").get_secrets() == {}


def test_moving_a_connection_from_its_page_drops_the_password_unless_a_new_one_is_typed(editor, db):
    editor.post(
        reverse("connection-new"),
        {"kind": "postgres", "name": "dw", "dsn": "postgresql://app@db:5432/dw", "password": "pw1"},
    )
    url = reverse("connection-edit", kwargs={"name": "dw"})
    response = editor.post(
        url, {"dsn": "postgresql://app@elsewhere:5432/dw", "description": "moved"}, follow=True
    )
    assert "its stored password was removed" in response.content.decode()
    stored = Connection.objects.get(name="dw")
    assert (stored.settings["dsn"], stored.get_secrets()) == (
        "postgresql://app@elsewhere:5432/dw",
        {},
    )
    editor.post(url, {"dsn": "postgresql://app@db:5432/dw", "password": "pw2"})
    assert Connection.objects.get(name="dw").get_secrets() == {"password": "pw2"}
    actions = list(
        AuditEntry.objects.filter(connection_name="dw")
        .order_by("id")
        .values_list("action", "after__secrets_dropped")
    )
    assert actions == [
        ("connection-create", None),
        ("connection-update", ["password"]),
        ("connection-update", None),
    ]


def test_a_kafka_sink_is_edited_with_its_own_fields_and_problems_land_on_them():
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    post = {
        **form_for(spec),
        "sink_kind": "kafka",
        "sink_connection": "events",
        "sink_topic": "orders-clean",
        "record_key": "id",
        "record_headers": '{"origin": "\'orders\'"}',
        "table": "ignored",  # the other kind's field: not sent
    }
    parsed = forms.pipeline_from_form(post, spec)
    sink = parse_spec(parsed.data["spec"], connections=known).to_dict()["sink"]
    assert (sink["kind"], sink["topic"], sink["key"], sink["headers"]) == (
        "kafka",
        "orders-clean",
        "id",
        {"origin": "'orders'"},
    )
    again = forms.pipeline_values("orders", "", parse_spec(parsed.data["spec"]).to_dict())
    assert (again["sink_topic"], again["record_key"], "table" in again) == (
        "orders-clean",
        "id",
        False,
    )
    placed = forms.place_errors(
        {"spec.sink.key": ["calls the function 'reflect'"], "spec.sink.topic": ["bad"]},
        forms.PIPELINE_FIELDS,
        sink="kafka",
    )
    assert placed == {"record_key": ["calls the function 'reflect'"], "sink_topic": ["bad"]}


def test_an_editor_creates_a_kafka_to_kafka_pipeline_from_the_form(
    editor, kafka_connection, postgres_connection
):
    page = editor.get(reverse("pipeline-new")).content.decode()
    assert 'data-sink="kafka"' in page and 'id="f-sink_topic"' in page
    post = new_pipeline_post(
        sink_kind="kafka",
        sink_connection="events",
        sink_topic="payments-clean",
        record_key="reflect('a', 'b')",
        table=None,
        mode=None,
    )
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert "reflect" in field_errors(response.content.decode(), "record_key")
    response = editor.post(reverse("pipeline-new"), {**post, "record_key": "id"})
    assert response.status_code == 302, response.content.decode()[:2000]
    sink = Pipeline.objects.get(name="payments").spec["sink"]
    assert (sink["kind"], sink["topic"], sink["key"]) == ("kafka", "payments-clean", "id")
    # Its pages: the pipeline's, and its dead letters' (which are in a topic, and say so).
    page = editor.get(reverse("pipeline", kwargs={"name": "payments"})).content.decode()
    assert "records of topic <code>payments-clean.dead-letters</code>" in page
    page = editor.get(reverse("pipeline-dead-letters", kwargs={"name": "payments"}))
    assert "payments-clean.dead-letters" in page.content.decode()


def test_an_avro_source_is_edited_with_its_schema_and_its_columns_are_derived():
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    spec.pop("transform", None)
    avro = '{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "string"}]}'
    post = {**form_for(spec), "format": "avro", "avro_schema": avro, "avro_framing": "confluent"}
    source = parse_spec(forms.pipeline_from_form(post, spec).data["spec"]).to_dict()["source"]
    assert (source["format"], source["schema"], source["avro_framing"]) == (
        "avro",
        "`id` STRING",
        "confluent",
    )
    # Edited again with another Avro schema: the old derived columns do not get in the way.
    again = forms.pipeline_values(
        "orders", "", parse_spec(forms.pipeline_from_form(post, spec).data["spec"]).to_dict()
    )
    wider = avro.replace('"string"}]', '"string"}, {"name": "n", "type": "long"}]')
    changed = {**{k: v for k, v in again.items() if v not in ("", False)}, "avro_schema": wider}
    source = parse_spec(forms.pipeline_from_form(changed, spec).data["spec"]).to_dict()["source"]
    assert source["schema"] == "`id` STRING, `n` BIGINT"
    errors = forms.place_errors({"spec.source.avro_schema": ["is not JSON"]}, forms.PIPELINE_FIELDS)
    assert errors == {"avro_schema": ["is not JSON"]}


def test_several_sinks_are_edited_as_a_list_and_replace_the_one_sink():
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    sinks = [
        {"connection": "warehouse", "table": "a"},
        {"kind": "kafka", "connection": "events", "topic": "out"},
    ]
    import json as _json

    parsed = forms.pipeline_from_form({**form_for(spec), "sinks": _json.dumps(sinks)}, spec)
    several = parse_spec(parsed.data["spec"], connections=known).to_dict()
    assert "sink" not in several and [s["kind"] for s in several["sinks"]] == ["postgres", "kafka"]
    values = forms.pipeline_values("orders", "", several)
    assert _json.loads(values["sinks"]) == several["sinks"]
    # Emptied: back to the one sink of the form's fields.
    back = forms.pipeline_from_form({**form_for(spec), "sinks": ""}, several).data["spec"]
    assert "sinks" not in back and parse_spec(back, connections=known).sink.table
    placed = forms.place_errors({"spec.sinks[1].topic": ["is required"]}, forms.PIPELINE_FIELDS)
    assert placed == {"sinks": ["sinks[1].topic: is required"]}


# -- files: the sink's fields and the connection's root ------------------------------------------


def test_a_files_sink_is_edited_with_its_own_fields_and_problems_land_on_them():
    known = {"events": "kafka", "warehouse": "postgres", "lake": "files"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    post = {
        **form_for(spec),
        "sink_kind": "files",
        "sink_connection": "lake",
        "files_path": "sales/orders",
        "files_format": "json",
        "partition_by": "id, ts",
        "target_file_mb": "64",
        "max_file_age_seconds": "120",
        "table": "ignored",  # the other kinds' fields: not sent
        "sink_topic": "ignored",
    }
    parsed = forms.pipeline_from_form(post, spec)
    assert parsed.errors == {}
    sink = parse_spec(parsed.data["spec"], connections=known).to_dict()["sink"]
    assert sink == {
        "kind": "files",
        "connection": "lake",
        "path": "sales/orders",
        "format": "json",
        "partition_by": ["id", "ts"],
        "target_file_mb": 64,
        "max_file_age_seconds": 120.0,
        "inactivity_seconds": 300.0,
    }
    again = forms.pipeline_values("orders", "", parse_spec(parsed.data["spec"]).to_dict())
    assert (again["files_path"], again["files_format"], again["partition_by"]) == (
        "sales/orders",
        "json",
        "id, ts",
    )
    assert "table" not in again and "sink_topic" not in again
    round_trip = forms.pipeline_from_form(form_for(parse_spec(parsed.data["spec"]).to_dict()), {})
    assert parse_spec(round_trip.data["spec"]).to_dict()["sink"] == sink
    placed = forms.place_errors(
        {
            "spec.sink.path": ["pipeline 'x' writes its files there already"],
            "spec.sink.partition_by[1]": ["column 'ts' is not in the source schema"],
            "spec.sink.inactivity_seconds": ["must be more than 0"],
        },
        forms.PIPELINE_FIELDS,
        sink="files",
    )
    assert placed == {
        "files_path": ["pipeline 'x' writes its files there already"],
        "partition_by": ["sink.partition_by[1]: column 'ts' is not in the source schema"],
        "inactivity_seconds": ["must be more than 0"],
    }


def test_an_editor_creates_a_files_pipeline_from_the_form_and_an_overlap_is_shown_on_its_path(
    editor, kafka_connection, files_connection, files_dir
):
    page = editor.get(reverse("pipeline-new")).content.decode()
    assert '<option value="files">' in page and '<option value="lake">' in page
    assert 'data-sink="files"' in page and 'id="f-files_path"' in page
    post = new_pipeline_post(
        sink_kind="files",
        sink_connection="lake",
        files_path="payments",
        files_format="parquet",
        partition_by="1x",
        table=None,
        mode=None,
    )
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert "is not a partition column name" in field_errors(
        response.content.decode(), "partition_by"
    )
    response = editor.post(reverse("pipeline-new"), {**post, "partition_by": ""})
    assert response.status_code == 302, response.content.decode()[:2000]
    sink = Pipeline.objects.get(name="payments").spec["sink"]
    assert (sink["kind"], sink["connection"], sink["path"]) == ("files", "lake", "payments")
    page = editor.get(reverse("pipeline", kwargs={"name": "payments"})).content.decode()
    assert f"<code>file://{files_dir}/lake/payments/_cp_dead_letters/</code>" in page
    # Another pipeline into a directory inside it: refused, the problem under the path.
    response = editor.post(
        reverse("pipeline-new"),
        {**post, "name": "refunds", "files_path": "payments/refunds", "partition_by": ""},
    )
    assert response.status_code == 400
    assert "where pipeline &#x27;payments&#x27; writes its files" in field_errors(
        response.content.decode(), "files_path"
    )


def test_an_editor_defines_a_files_connection_and_a_bad_root_is_shown_on_its_field(
    editor, files_dir
):
    listing = editor.get(reverse("connections")).content.decode()
    assert "?kind=files" in listing
    form = editor.get(reverse("connection-new") + "?kind=files").content.decode()
    assert 'id="f-root"' in form and "New files connection" in form
    response = editor.post(
        reverse("connection-new"), {"kind": "files", "name": "lake", "root": "/srv/lake"}
    )
    assert response.status_code == 400
    assert "must be a URI" in field_errors(response.content.decode(), "root")
    response = editor.post(
        reverse("connection-new"),
        {"kind": "files", "name": "lake", "root": f"file://{files_dir}/lake/"},
    )
    assert response.status_code == 302
    stored = Connection.objects.get(name="lake")
    assert (stored.kind, stored.settings) == ("files", {"root": f"file://{files_dir}/lake"})
    listing = editor.get(reverse("connections")).content.decode()
    assert "File system (local or Hadoop)" in listing and f"file://{files_dir}/lake" in listing
    form = editor.get(reverse("connection-edit", kwargs={"name": "lake"})).content.decode()
    assert f'value="file://{files_dir}/lake"' in form


# -- stateful pipelines: event time, deduplication, output mode, state store ------------------

WINDOW_SQL = (
    "SELECT window.start AS window_start, window.end AS window_end, id, count(*) AS n "
    "FROM source GROUP BY window(ts, '5 minutes'), id"
)


def stateful_spec(**changes) -> dict:
    """valid_spec() counting per id per 5 minutes, in update mode into an upsert."""
    source = {
        **valid_spec()["source"],
        "watermark": {"column": "ts", "delay_seconds": 30},
        "deduplicate": {"key": ["id"]},
    }
    sink = {**valid_spec()["sink"], "key": ["window_start", "window_end", "id"]}
    spec = valid_spec(
        source=source,
        transform={"sql": WINDOW_SQL, "output_mode": "update"},
        sink=sink,
        state_store="hdfs",
    )
    spec.update(changes)
    return spec


@pytest.mark.parametrize("store", ["hdfs", "rocksdb", None])
def test_a_stateful_spec_survives_the_round_trip_through_the_form(store):
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(stateful_spec(state_store=store), connections=known).to_dict()
    values = forms.pipeline_values("orders", "", spec)
    assert (
        values["watermark_column"],
        values["watermark_delay_seconds"],
        values["deduplicate_key"],
        values["output_mode"],
        values["state_store"],
    ) == ("ts", "30", "id", "update", store or "rocksdb")
    parsed = forms.pipeline_from_form(form_for(spec), spec)
    assert parsed.errors == {}
    assert parse_spec(parsed.data["spec"], connections=known).to_dict() == spec


def test_event_time_and_state_inputs_become_the_spec_and_emptied_ones_leave_it():
    known = {"events": "kafka", "warehouse": "postgres"}
    spec = parse_spec(valid_spec(), connections=known).to_dict()
    post = {
        **form_for(spec),
        "watermark_column": "ts",
        "watermark_delay_seconds": "90",
        "deduplicate_key": " id ,",
        "transform_sql": WINDOW_SQL,
        "mode": "append",
        "key": "",
    }
    parsed = forms.pipeline_from_form(post, spec)
    assert parsed.errors == {}
    made = parse_spec(parsed.data["spec"], connections=known)
    assert made.source.watermark.column == "ts" and made.source.watermark.delay_seconds == 90
    assert made.source.deduplicate.key == ("id",)
    # No output mode: append over the stream (stateful), with RocksDB (null in the spec).
    assert (made.transform.output_mode, made.output_mode, made.state_store) == (
        None,
        "append",
        None,
    )
    # Everything emptied (RocksDB, the default store, stays chosen): a stateless spec again.
    stored = made.to_dict()
    cleared = {
        **form_for(stored),
        "watermark_column": "",
        "watermark_delay_seconds": "",
        "deduplicate_key": "",
        "output_mode": "",
        "transform_sql": "SELECT id FROM source",
        "state_store": "rocksdb",
    }
    back = forms.pipeline_from_form(cleared, stored).data["spec"]
    assert (back["source"].get("watermark"), back["source"].get("deduplicate")) == (None, None)
    assert "state_store" not in back and "output_mode" not in back["transform"]
    assert not parse_spec(back, connections=known).stateful


def test_an_output_mode_without_a_transform_is_reported_on_it():
    parsed = forms.pipeline_from_form({"output_mode": "update", "transform_sql": ""}, None)
    assert parsed.errors == {
        "output_mode": ["applies to a transform: write its SQL, or choose per batch"]
    }


def test_stateful_problems_are_placed_next_to_the_input_they_concern():
    placed = forms.place_errors(
        {
            "spec.source.watermark": ["is required for an aggregation"],
            "spec.source.watermark.delay_seconds": ["must be at most 604800, got 1e+06"],
            "spec.source.deduplicate": ["needs source.watermark"],
            "spec.source.deduplicate.key[1]": ["column 'x' is not in the source schema"],
            "spec.transform.output_mode": ["complete is not supported"],
            "spec.transform.sql": ["ORDER BY does not run on a stream"],
            "spec.state_store": ["applies to stateful pipelines only"],
            "spec.sink.mode": ["must be upsert with update output"],
            "spec.sink.key[1]": ["column 'n' is not a GROUP BY column"],
        },
        forms.PIPELINE_FIELDS,
    )
    assert placed == {
        "watermark_column": ["is required for an aggregation"],
        "watermark_delay_seconds": ["must be at most 604800, got 1e+06"],
        "deduplicate_key": [
            "needs source.watermark",
            "source.deduplicate.key[1]: column 'x' is not in the source schema",
        ],
        "output_mode": ["complete is not supported"],
        "transform_sql": ["ORDER BY does not run on a stream"],
        "state_store": ["applies to stateful pipelines only"],
        "mode": ["must be upsert with update output"],
        "key": ["sink.key[1]: column 'n' is not a GROUP BY column"],
    }
    # The sink's kind, for a kind that cannot take update output (files; and in a list).
    placed = forms.place_errors(
        {"spec.sink.kind": ["a files sink takes append output only"]},
        forms.PIPELINE_FIELDS,
        sink="files",
    )
    assert placed == {"sink_kind": ["a files sink takes append output only"]}
    placed = forms.place_errors({"spec.sinks[1].kind": ["append only"]}, forms.PIPELINE_FIELDS)
    assert placed == {"sinks": ["sinks[1].kind: append only"]}


def test_the_edit_form_of_a_stateful_pipeline_shows_its_event_time_and_state(
    editor, api, kafka_connection, postgres_connection
):
    response = api.post(
        "/api/pipelines/", {"name": "counts", "spec": stateful_spec()}, format="json"
    )
    assert response.status_code == 201, response.json()
    html = editor.get(reverse("pipeline-edit", kwargs={"name": "counts"})).content.decode()
    assert "Event time and state" in html
    assert 'id="f-watermark_column" value="ts"' in html
    assert 'id="f-watermark_delay_seconds" value="30"' in html
    assert 'id="f-deduplicate_key" value="id"' in html
    assert '<option value="update" selected>update (changed groups)</option>' in html
    assert '<option value="hdfs" selected>HDFS-backed (Spark&#x27;s default)</option>' in html
    # Saved as shown: no new version.
    stored = Pipeline.objects.get(name="counts")
    post = {**form_for(stored.spec), "version": "1"}
    post.pop("name")
    response = editor.post(reverse("pipeline-edit", kwargs={"name": "counts"}), post)
    assert response.status_code == 302, response.content.decode()[:2000]
    stored.refresh_from_db()
    assert stored.version == 1
    # A new pipeline's form: per batch, RocksDB.
    html = editor.get(reverse("pipeline-new")).content.decode()
    assert '<option value="" selected>per batch</option>' in html
    assert '<option value="rocksdb" selected>RocksDB (default)</option>' in html


def test_an_aggregation_in_append_mode_without_a_watermark_is_refused_at_the_event_time_input(
    editor, kafka_connection, postgres_connection
):
    post = new_pipeline_post(
        schema="id STRING, amount DOUBLE, ts TIMESTAMP",
        transform_sql=WINDOW_SQL,
        output_mode="append",
        table="counts",
    )
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    html = response.content.decode()
    assert "is required for an aggregation: append writes each group once" in field_errors(
        html, "watermark_column"
    )
    assert '<option value="append" selected>' in html  # the input is kept
    assert not Pipeline.objects.filter(name="payments").exists()
    # With event time: created, a stateful pipeline.
    response = editor.post(
        reverse("pipeline-new"),
        {**post, "watermark_column": "ts", "watermark_delay_seconds": "60"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    spec = Pipeline.objects.get(name="payments").spec
    assert spec["source"]["watermark"] == {"column": "ts", "delay_seconds": 60}
    assert (spec["transform"]["output_mode"], spec["state_store"]) == ("append", None)
