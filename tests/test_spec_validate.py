"""Spec v1 validation: pure logic, no database."""

from __future__ import annotations

import copy

import pytest

from jobs.spec import ExponentialDelay, FailureRate, FixedDelay, NoRestart, SpecError, parse_spec
from jobs.spec.model import starting_timestamp_ms
from tests.factories import valid_spec

CONNECTIONS = {"events": "kafka", "warehouse": "postgres"}


def errors_of(spec, connections=CONNECTIONS) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, connections=connections)
    return caught.value.as_dict()


def with_change(path: str, value):
    spec = valid_spec()
    node = spec
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    node[last] = value
    return spec


def test_it_accepts_a_valid_spec_and_keeps_its_values():
    spec = parse_spec(valid_spec(), connections=CONNECTIONS)
    assert spec.source.topics == ("orders",)
    assert spec.sink.key == ("id",)
    assert spec.restart_policy == FixedDelay(attempts=3, delay_seconds=10)
    assert spec.trigger.interval_seconds == 5


def test_canonical_form_spells_out_every_default_and_parses_again():
    minimal = {
        "source": {"connection": "events", "topics": ["t"], "schema": "id STRING"},
        "sink": {"connection": "warehouse", "table": "t"},
    }
    canonical = parse_spec(minimal, connections=CONNECTIONS).to_dict()
    assert canonical["source"]["starting_offsets"] == "latest"
    assert canonical["source"]["format"] == "json"
    assert canonical["sink"]["mode"] == "append"
    assert canonical["transform"] is None
    assert canonical["trigger"] == {"interval_seconds": 1.0}
    assert canonical["restart_policy"]["kind"] == "exponential-delay"
    assert parse_spec(canonical, connections=CONNECTIONS).to_dict() == canonical


def test_restart_policy_defaults_follow_flink_1_20():
    def policy(kind):
        return parse_spec(
            with_change("restart_policy", {"kind": kind}), connections=CONNECTIONS
        ).restart_policy

    assert policy("fixed-delay") == FixedDelay(attempts=1, delay_seconds=1.0)
    assert policy("failure-rate") == FailureRate(
        max_failures=1, interval_seconds=60.0, delay_seconds=1.0
    )
    assert policy("exponential-delay") == ExponentialDelay(
        initial_backoff_seconds=1.0,
        max_backoff_seconds=60.0,
        multiplier=1.5,
        jitter=0.1,
        reset_after_seconds=3600.0,
        max_attempts=None,
    )
    assert policy("none") == NoRestart()


def test_a_missing_restart_policy_means_exponential_delay_as_in_flink_with_checkpoints():
    spec = valid_spec()
    del spec["restart_policy"]
    assert isinstance(parse_spec(spec, connections=CONNECTIONS).restart_policy, ExponentialDelay)


def test_it_rejects_an_unknown_connection_and_names_the_known_ones():
    errors = errors_of(with_change("source.connection", "nope"))
    assert errors == {
        "source.connection": ["no connection named 'nope' (known: events, warehouse)"]
    }


def test_it_rejects_a_connection_of_the_wrong_kind():
    errors = errors_of(with_change("sink.connection", "events"))
    assert errors["sink.connection"] == ["connection 'events' is a kafka connection, not postgres"]


def test_it_rejects_bad_spark_ddl():
    errors = errors_of(with_change("source.schema", "id STRNG, amount DOUBLE"))
    assert list(errors) == ["source.schema"]
    assert "STRNG" in errors["source.schema"][0]


def test_it_rejects_sql_that_does_not_parse():
    errors = errors_of(with_change("transform", {"sql": "SELEC id FROM source"}))
    assert list(errors) == ["transform.sql"]


def test_it_rejects_sql_reading_anything_but_the_source_view():
    errors = errors_of(with_change("transform", {"sql": "SELECT * FROM users"}))
    assert "users" in errors["transform.sql"][0]


def test_it_rejects_sql_that_is_not_a_query():
    errors = errors_of(with_change("transform", {"sql": "DROP TABLE source"}))
    assert list(errors) == ["transform.sql"]


@pytest.mark.parametrize(
    "table",
    ["Orders", "orders; drop table x", "1orders", "a.b.c", 'or"ders', "x" * 64, ""],
)
def test_it_rejects_unsafe_table_names(table):
    errors = errors_of(with_change("sink.table", table))
    assert list(errors) == ["sink.table"]


def test_it_accepts_a_schema_qualified_table():
    spec = parse_spec(with_change("sink.table", "analytics.orders"), connections=CONNECTIONS)
    assert spec.sink.table == "analytics.orders"


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"kind": "fixed-delay", "delay_seconds": -1}, "restart_policy.delay_seconds"),
        ({"kind": "fixed-delay", "attempts": -2}, "restart_policy.attempts"),
        ({"kind": "failure-rate", "interval_seconds": 0}, "restart_policy.interval_seconds"),
        ({"kind": "failure-rate", "delay_seconds": -0.5}, "restart_policy.delay_seconds"),
        ({"kind": "failure-rate", "max_failures": 0}, "restart_policy.max_failures"),
        (
            {"kind": "exponential-delay", "initial_backoff_seconds": -1},
            "restart_policy.initial_backoff_seconds",
        ),
        ({"kind": "exponential-delay", "multiplier": 0.5}, "restart_policy.multiplier"),
        ({"kind": "exponential-delay", "jitter": 1.5}, "restart_policy.jitter"),
        ({"kind": "exponential-delay", "max_attempts": 0}, "restart_policy.max_attempts"),
        (
            {"kind": "exponential-delay", "initial_backoff_seconds": 120},
            "restart_policy.initial_backoff_seconds",
        ),
        ({"kind": "sometimes"}, "restart_policy.kind"),
        ({"attempts": 3}, "restart_policy.kind"),
        ({"kind": "none", "attempts": 3}, "restart_policy.attempts"),
    ],
)
def test_it_rejects_bad_restart_policies(policy, field):
    assert field in errors_of(with_change("restart_policy", policy))


def test_it_rejects_a_negative_trigger_interval():
    errors = errors_of(with_change("trigger", {"interval_seconds": -5}))
    assert errors == {"trigger.interval_seconds": ["must be at least 0, got -5"]}


def test_it_rejects_upsert_without_a_key_and_a_key_in_append_mode():
    assert "sink.key" in errors_of(with_change("sink.key", []))
    spec = with_change("sink.mode", "append")
    assert errors_of(spec) == {"sink.key": ["applies to upsert mode only"]}


def test_without_a_transform_the_key_must_be_a_source_column():
    spec = valid_spec()
    spec["transform"] = None
    spec["sink"]["key"] = ["order_id"]
    assert errors_of(spec) == {"sink.key[0]": ["column 'order_id' is not in the source schema"]}


def test_it_names_unknown_fields_so_typos_do_not_pass_silently():
    errors = errors_of(with_change("trigger", {"intervall_seconds": 5}))
    assert errors == {"trigger.intervall_seconds": ["unknown field"]}


def test_it_reports_every_problem_at_once():
    spec = valid_spec()
    spec["source"]["connection"] = "nope"
    spec["source"]["topics"] = ["ok", "bad topic!"]
    spec["source"]["max_records_per_batch"] = 0
    spec["sink"]["table"] = "DROP"
    spec["restart_policy"] = {"kind": "fixed-delay", "delay_seconds": -1}
    errors = errors_of(spec)
    assert set(errors) == {
        "source.connection",
        "source.topics[1]",
        "source.max_records_per_batch",
        "sink.table",
        "restart_policy.delay_seconds",
    }


def test_it_requires_source_and_sink_and_an_object():
    assert errors_of({}) == {"source": ["is required"], "sink": ["is required"]}
    assert errors_of([1, 2]) == {
        "": ["must be an object, got a list"],
        "source": ["is required"],
        "sink": ["is required"],
    }


def test_per_partition_starting_offsets_must_name_listed_topics():
    ok = with_change("source.starting_offsets", {"orders": {"0": 15, "1": -2}})
    assert parse_spec(ok, connections=CONNECTIONS).source.starting_offsets == {
        "orders": {"0": 15, "1": -2}
    }
    errors = errors_of(with_change("source.starting_offsets", {"other": {"0": 1}}))
    assert "source.starting_offsets.other" in errors
    errors = errors_of(with_change("source.starting_offsets", {"orders": {"0": -7}}))
    assert "source.starting_offsets.orders.0" in errors


def test_without_a_connection_list_references_are_not_checked():
    spec = with_change("source.connection", "anything")
    assert parse_spec(spec).source.connection == "anything"


def test_parsing_does_not_modify_its_input():
    spec = valid_spec()
    before = copy.deepcopy(spec)
    parse_spec(spec, connections=CONNECTIONS)
    assert spec == before


def test_char_and_varchar_are_refused_because_from_json_cannot_use_them():
    errors = errors_of(with_change("source.schema", "id VARCHAR(10), tags ARRAY<CHAR(2)>"))
    assert errors == {
        "source.schema": [
            "VARCHAR(10) cannot be used to parse JSON (Spark's from_json refuses it): use STRING"
        ]
    }


def test_column_names_the_control_plane_uses_itself_are_refused():
    errors = errors_of(with_change("source.schema", "id STRING, _CP_bad BOOLEAN"))
    assert errors == {
        "source.schema": [
            "column '_CP_bad': names starting with _cp_ are reserved for the control plane's"
            " own columns"
        ]
    }


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("2026-11-21T10:00:00Z", "2026-11-21T10:00:00Z"),
        ("2026-11-21T11:30:00+01:30", "2026-11-21T10:00:00Z"),
        ("2026-11-21T10:00:00.250Z", "2026-11-21T10:00:00.250000Z"),
        (1_795_255_200_000, "2026-11-21T10:00:00Z"),
    ],
)
def test_a_start_time_is_kept_in_utc(given, kept):
    spec = parse_spec(
        with_change("source.starting_offsets", {"timestamp": given}), connections=CONNECTIONS
    )
    assert spec.source.starting_offsets == {"timestamp": kept}
    assert starting_timestamp_ms(spec.source.starting_offsets) == 1_795_255_200_000 + (
        250 if ".250" in kept else 0
    )


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("2026-11-21T10:00:00", "needs a UTC offset"),
        ("yesterday", "must be an ISO 8601 time"),
        (True, "must be an ISO 8601 time"),
        ([2026], "must be an ISO 8601 time"),
    ],
)
def test_a_start_time_must_be_a_definite_moment(given, problem):
    errors = errors_of(with_change("source.starting_offsets", {"timestamp": given}))
    assert list(errors) == ["source.starting_offsets.timestamp"]
    assert problem in errors["source.starting_offsets.timestamp"][0]


def test_a_topic_named_timestamp_still_takes_per_partition_offsets():
    spec = with_change("source.topics", ["timestamp"])
    spec["source"]["starting_offsets"] = {"timestamp": {"0": 5}}
    parsed = parse_spec(spec, connections=CONNECTIONS)
    assert parsed.source.starting_offsets == {"timestamp": {"0": 5}}
    assert starting_timestamp_ms(parsed.source.starting_offsets) is None


def test_a_consumer_group_to_mirror_offsets_to_is_checked():
    spec = parse_spec(
        with_change("source.consumer_group", "orders.cp-mirror_1"), connections=CONNECTIONS
    )
    assert spec.source.consumer_group == "orders.cp-mirror_1"
    assert parse_spec(valid_spec(), connections=CONNECTIONS).source.consumer_group is None
    assert (
        "letters, digits"
        in errors_of(with_change("source.consumer_group", "a b"))["source.consumer_group"][0]
    )


# -- the Kafka sink ----------------------------------------------------------------------------


def kafka_sink(**fields) -> dict:
    spec = valid_spec()
    spec["sink"] = {"kind": "kafka", "connection": "events", "topic": "orders-clean", **fields}
    spec.pop("transform", None)
    return spec


def test_a_kafka_sink_spells_out_its_defaults_and_parses_again():
    canonical = parse_spec(kafka_sink(), connections=CONNECTIONS).to_dict()
    assert canonical["sink"] == {
        "connection": "events",
        "topic": "orders-clean",
        "key": None,
        "value": None,
        "headers": {},
        "format": "json",
        "schema_registry": None,
        "dead_letter_topic": "orders-clean.dead-letters",
        "transaction_timeout_seconds": 120,
        "kind": "kafka",
    }
    assert parse_spec(canonical, connections=CONNECTIONS).to_dict() == canonical


def test_a_kafka_sink_s_expressions_follow_the_transform_s_rules_and_name_their_field():
    errors = errors_of(
        kafka_sink(
            key="reflect('java.lang.Runtime', 'getRuntime')",
            value="named_struct('id', nope)",
            headers={"origin": "'x'", "cp-error": "'forged'", "bad name": "'x'", "n": 3},
        )
    )
    assert "reflect" in errors["sink.key"][0] and "not allowed" in errors["sink.key"][0]
    assert "unknown column 'nope'" in errors["sink.value"][0]
    assert "reserved" in errors["sink.headers.cp-error"][0]
    assert errors["sink.headers.bad name"] and errors["sink.headers.n"]
    assert "sink.headers.origin" not in errors
    # One expression, not a way to smuggle in more of a query.
    errors = errors_of(kafka_sink(key="id) AS a, (id", value="id FROM source --"))
    assert errors["sink.key"] == ["must be one SQL expression, such as concat(a, '-', b)"]
    assert errors["sink.value"]
    # Nor a list, *, an alias or a subquery (Spark's expression parser would take none).
    for text in ("id, amount", "*", "id AS k", "(SELECT max(id) FROM source)"):
        assert errors_of(kafka_sink(key=text))["sink.key"], text


def test_a_kafka_sink_refuses_bad_topics_connections_and_timeouts():
    errors = errors_of(
        kafka_sink(
            connection="warehouse",
            topic="not a topic",
            dead_letter_topic="__consumer_offsets",
            transaction_timeout_seconds=3600,
            table="extra",
        )
    )
    assert errors["sink.connection"] == [
        "connection 'warehouse' is a postgres connection, not kafka"
    ]
    assert "not a valid Kafka topic name" in errors["sink.topic"][0]
    assert "Kafka's own" in errors["sink.dead_letter_topic"][0]
    assert errors["sink.transaction_timeout_seconds"] == ["must be at most 900, got 3600"]
    assert errors["sink.table"] == ["unknown field"]
    # Writing into its own source topic would read its own output forever.
    errors = errors_of(kafka_sink(topic="orders"))
    assert "source topic" in errors["sink.topic"][0]
    assert errors_of(kafka_sink(topic="x", dead_letter_topic="x"))["sink.dead_letter_topic"]
    assert (
        "must be one of postgres, kafka"
        in errors_of(with_change("sink.kind", "s3"))["sink.kind"][0]
    )


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("source.topics", ["orders\n"], "source.topics[0]"),
        ("sink.table", "clean_orders\n", "sink.table"),
    ],
)
def test_a_name_with_a_trailing_newline_is_refused(path, value, field):
    # `$` matches before a final newline: names are checked whole (re.fullmatch).
    assert field in errors_of(with_change(path, value))


@pytest.mark.parametrize(
    ("sink", "field"),
    [
        ({"path": "orders\n"}, "sink.path"),
        ({"partition_by": ["day\n"]}, "sink.partition_by[0]"),
        ({"path": "orders//clean"}, "sink.path"),
    ],
)
def test_files_sink_names_are_checked_whole(sink, field):
    from tests.factories import files_spec

    connections = {**CONNECTIONS, "lake": "files"}
    assert field in errors_of(files_spec(**sink), connections)


def test_avro_fields_whose_names_differ_only_in_case_are_a_field_error():
    """Spark's column names are case-insensitive: A and a would be one column (a 500 before,
    found by the API fuzzer)."""
    record = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "A", "type": "string"}, {"name": "a", "type": "int"}],
    }
    spec = with_change(
        "source", {"connection": "events", "topics": ["t"], "format": "avro", "avro_schema": record}
    )
    assert "duplicate column name" in errors_of(spec)["source.avro_schema"][0]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda s: s["source"].update(max_records_per_batch=10**30),
            "source.max_records_per_batch",
        ),
        (
            lambda s: s.update(restart_policy={"kind": "fixed-delay", "attempts": 10**300}),
            "restart_policy.attempts",
        ),
        (
            lambda s: s["source"].update(starting_offsets={"orders": {"0": 10**29}}),
            "source.starting_offsets.orders.0",
        ),
    ],
)
def test_whole_numbers_beyond_a_java_long_are_refused_at_their_field(change, field):
    """Whole numbers reach the JVM as longs (Kafka offsets, Spark options): beyond 2^63-1 a
    spec would be stored and then fail at every start."""
    spec = valid_spec()
    change(spec)
    found = errors_of(spec)
    assert field in found, found
    assert "at most 9223372036854775807" in found[field][0] or "2^63-1" in found[field][0]
