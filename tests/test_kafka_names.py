"""Kafka's own names (jobs.kafka.names) and every parser that goes through them: pure logic,
no database, no broker. Through the API, the pages and a real broker:
tests/api/test_kafka_internals.py."""

from __future__ import annotations

import jsonschema
import pytest

from jobs.connections import kafka_client_config, validate_connection
from jobs.kafka.names import internal_problem, is_internal
from jobs.kafka.readers import java_client_options
from jobs.spec import SpecError, parse_spec
from jobs.spec.schema import spec_json_schema
from tests.factories import valid_spec

CONNECTIONS = {"events": "kafka", "warehouse": "postgres"}


@pytest.mark.parametrize(
    "name",
    ["__consumer_offsets", "__transaction_state", "__share_group_state", "__admin_client", "__"],
)
def test_names_starting_with_two_underscores_are_kafka_s_own(name):
    assert is_internal(name)
    for kind in ("topic", "consumer group", "client id"):
        problem = internal_problem(kind, name)
        assert problem is not None
        assert problem.startswith(f"{name!r}: {kind}s starting with __ are Kafka's own")


@pytest.mark.parametrize("name", ["orders", "_orders", "a__b", "._x", "orders__", "cp.x.y"])
def test_other_names_are_not(name):
    assert not is_internal(name)
    assert internal_problem("topic", name) is None


def test_the_client_id_message_says_why():
    assert "__admin_client may write the broker's internal topics" in internal_problem(
        "client id", "__admin_client"
    )


def spec_errors(spec: dict) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        parse_spec(spec, connections=CONNECTIONS)
    return caught.value.as_dict()


def kafka_sink(**fields) -> dict:
    spec = valid_spec(sink={"kind": "kafka", "connection": "events", "topic": "out", **fields})
    spec.pop("transform")
    return spec


def test_every_spec_field_that_names_a_topic_or_group_refuses_kafka_s_own():
    source = valid_spec()["source"]
    cases = [
        (valid_spec(source={**source, "topics": ["orders", "__consumer_offsets"]}),
         "source.topics[1]"),
        (valid_spec(source={**source, "topics": "__transaction_state"}), "source.topics[0]"),
        (valid_spec(source={**source, "consumer_group": "__cp-mirror"}), "source.consumer_group"),
        (kafka_sink(topic="__consumer_offsets"), "sink.topic"),
        (kafka_sink(dead_letter_topic="__transaction_state"), "sink.dead_letter_topic"),
    ]  # fmt: skip
    several = valid_spec(
        sinks=[
            valid_spec()["sink"],
            {"kind": "kafka", "connection": "events", "topic": "__consumer_offsets"},
        ]
    )
    several.pop("sink")
    cases.append((several, "sinks[1].topic"))
    for spec, field in cases:
        errors = spec_errors(spec)
        assert list(errors) == [field], (field, errors)
        assert "are Kafka's own" in errors[field][0]


def test_starting_offsets_cannot_name_an_internal_topic_either():
    source = {**valid_spec()["source"], "starting_offsets": {"__consumer_offsets": {"0": 0}}}
    errors = spec_errors(valid_spec(source=source))
    assert "is not one of source.topics" in errors["source.starting_offsets.__consumer_offsets"][0]


def test_the_json_schema_refuses_them_too():
    validator = jsonschema.Draft202012Validator(spec_json_schema())
    assert not list(
        validator.iter_errors(parse_spec(valid_spec(), connections=CONNECTIONS).to_dict())
    )
    source = valid_spec()["source"]
    for spec in (
        valid_spec(source={**source, "topics": ["__consumer_offsets"]}),
        valid_spec(source={**source, "consumer_group": "__g"}),
        kafka_sink(topic="__consumer_offsets"),
        kafka_sink(dead_letter_topic="__transaction_state"),
    ):
        assert list(validator.iter_errors(spec)), spec
    # A null dead-letter topic or consumer group (the defaults) is still allowed.
    assert not list(validator.iter_errors(kafka_sink(dead_letter_topic=None)))
    assert not list(validator.iter_errors(valid_spec(source={**source, "consumer_group": None})))


def connection_errors(settings: dict) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        validate_connection("kafka", {"bootstrap_servers": ["k:9092"], **settings}, {})
    return caught.value.as_dict()


def test_a_connection_s_client_id_is_checked():
    clean, _ = validate_connection(
        "kafka", {"bootstrap_servers": ["k:9092"], "client_id": "nightly.cp_1-a"}, {}
    )
    assert clean["client_id"] == "nightly.cp_1-a"
    errors = connection_errors({"client_id": "__admin_client"})
    assert list(errors) == ["settings.client_id"]
    assert "a client named __admin_client may write" in errors["settings.client_id"][0]
    for bad in ("two words", "line\nbreak", "x" * 250, "ümlaut"):
        errors = connection_errors({"client_id": bad})
        assert "must be 1-249 letters, digits" in errors["settings.client_id"][0], bad


def test_no_other_kafka_client_property_gets_through_a_connection():
    for name in ("group_id", "group.id", "client.id", "kafka.client.id", "transactional_id"):
        assert connection_errors({name: "__x"}) == {f"settings.{name}": ["unknown field"]}


def test_a_stored_internal_client_id_never_reaches_a_client(caplog):
    """One stored before the check: left out of kafka-python's and the Java clients' configs."""
    settings = {"bootstrap_servers": ["k:9092"], "client_id": "__admin_client"}
    config = kafka_client_config(settings, {})
    assert "client_id" not in config
    assert "client.id" not in java_client_options(config)
    assert "client_id '__admin_client' is Kafka's own" in caplog.text
    config = kafka_client_config({**settings, "client_id": "nightly"}, {})
    assert config["client_id"] == "nightly"
    assert java_client_options(config)["client.id"] == "nightly"
