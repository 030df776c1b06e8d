"""The Kafka sink's Avro schema checked against its subject's compatibility rule when the spec
is saved (controlplane.definitions.schemas.check_sinks), through the API, against the real
schema registry `./stack test` starts (Apicurio's Confluent API): a first save (a new subject)
passes and registers nothing; once a run registered a schema, a change the subject's rule
refuses is refused at `spec.sink.schema_registry` naming the subject, the rule, the version
and the field, on create and on update, and one it allows is saved; the subject's own rule
(FORWARD) is the one applied; a spec whose value's type only Spark knows (a transform) is
saved, and the preflight says when each is checked; a registry that does not answer refuses
the save. Subjects are named after fresh topics: the registry outlives the tests."""

from __future__ import annotations

import socket
import uuid

import pytest
import requests

from jobs.registry.client import CONTENT_TYPE, NotFound, Registry
from tests.factories import valid_spec
from tests.stores import registry_url

pytestmark = [pytest.mark.kafka, pytest.mark.django_db]

# The schema Spark registers for the columns `id STRING, n BIGINT` (Spark's SchemaConverters:
# nullable columns as unions with null, the record `topLevelRecord`): what a run of the
# pipeline saved with them left in the registry, written out by hand.
V1 = (
    '{"type":"record","name":"topLevelRecord","fields":[{"name":"id","type":["string","null"]},'
    '{"name":"n","type":["long","null"]}]}'
)
FIELD = "spec.sink.schema_registry"


def fresh_topic() -> str:
    """A sink topic no other test (or run of the tests) named: a subject of its own."""
    return f"gate-{uuid.uuid4().hex[:12]}"


def avro_sink(topic: str, connection: str = "registry") -> dict:
    return {
        "kind": "kafka",
        "connection": "events",
        "topic": topic,
        "format": "avro",
        "schema_registry": {"connection": connection},
    }


def spec(topic: str, columns: str, transform: str | None = None, **sink) -> dict:
    return valid_spec(
        source={"connection": "events", "topics": ["gate-in"], "schema": columns},
        transform={"sql": transform} if transform else None,
        sink={**avro_sink(topic), **sink},
    )


def save(api, name: str, body: dict):
    return api.post("/api/pipelines/", {"name": name, "spec": body}, format="json")


def register(subject: str, schema: str) -> int:
    with Registry({"url": registry_url()}) as registry:
        return registry.register(subject, schema)


def test_backward_refuses_an_added_column_naming_it_and_takes_a_dropped_one(
    api, kafka_connection, registry_connection
):
    topic = fresh_topic()
    subject = f"{topic}-value"
    # A first save: a new subject, nothing to be compatible with; nothing is registered.
    response = save(api, "first", spec(topic, "id STRING, n BIGINT, extra STRING"))
    assert response.status_code == 201, response.json()
    assert response.json()["spec"]["sink"]["schema_registry"] == {
        "connection": "registry",
        "strategy": "topic",
        "record": None,
    }
    with Registry({"url": registry_url()}) as registry, pytest.raises(NotFound):
        registry.versions(subject)
    # A run registered V1 (id, n). The registry's default rule, BACKWARD: the new schema must
    # read what V1 wrote, and a column Spark writes has no default.
    register(subject, V1)
    response = save(api, "added", spec(topic, "id STRING, n BIGINT, extra STRING"))
    assert response.status_code == 400, response.json()
    [message] = response.json()[FIELD]
    assert f"compatibility rule BACKWARD of subject {subject!r}" in message
    assert "it cannot read what version 1 wrote: field extra: the reader has no default" in (
        message
    )
    # n as INT: the new schema cannot read V1's longs.
    response = save(api, "narrowed", spec(topic, "id STRING, n INT"))
    assert response.status_code == 400, response.json()
    assert "n: written as long" in response.json()[FIELD][0]
    # Dropping n is a change BACKWARD allows; V1 itself is what the subject has.
    response = save(api, "dropped", spec(topic, "id STRING"))
    assert response.status_code == 201, response.json()
    response = save(api, "same", spec(topic, "id STRING, n BIGINT"))
    assert response.status_code == 201, response.json()
    # An update is checked as a create is.
    response = api.patch(
        "/api/pipelines/same/",
        {"spec": {"source": {"schema": "id STRING, n BIGINT, late STRING"}}},
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert "field late" in response.json()[FIELD][0]
    with Registry({"url": registry_url()}) as registry:
        assert registry.versions(subject) == [1]  # the checks registered nothing


def test_the_subject_s_own_rule_applies_forward_refuses_a_dropped_column(
    api, kafka_connection, registry_connection
):
    topic = fresh_topic()
    subject = f"{topic}-value"
    register(subject, V1)
    response = requests.put(
        f"{registry_url()}/config/{subject}",
        json={"compatibility": "FORWARD"},
        headers={"Content-Type": CONTENT_TYPE},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    response = save(api, "dropped", spec(topic, "id STRING"))
    assert response.status_code == 400, response.json()
    [message] = response.json()[FIELD]
    assert f"compatibility rule FORWARD of subject {subject!r}" in message
    assert "version 1 cannot read what it writes: field n: the reader has no default" in message
    response = save(api, "added", spec(topic, "id STRING, n BIGINT, extra STRING"))
    assert response.status_code == 201, response.json()


def test_each_sink_is_checked_at_its_field_and_a_transform_s_value_at_the_run_s_start(
    api, kafka_connection, registry_connection
):
    free, taken = fresh_topic(), fresh_topic()
    register(f"{taken}-value", V1)
    body = spec(free, "id STRING, n BIGINT, extra STRING")
    body["sinks"] = [body.pop("sink"), avro_sink(taken)]
    response = save(api, "two", body)
    assert response.status_code == 400, response.json()
    assert set(response.json()) == {"spec.sinks[1].schema_registry"}, response.json()
    assert f"'{taken}-value'" in response.json()["spec.sinks[1].schema_registry"][0]
    # The same columns through a transform: only Spark knows the value's type, so the save
    # passes and the run's first batch meets the rule.
    transformed = spec(taken, "id STRING, n BIGINT", "SELECT id, n, 'x' AS extra FROM source")
    response = save(api, "transformed", transformed)
    assert response.status_code == 201, response.json()
    for body, status, words in (
        (transformed, "info", "known only when the run starts (a transform"),
        (spec(taken, "id STRING"), "ok", "meets the compatibility rule of subject"),
        # Not saved: the preflight asks the registry now.
        (spec(taken, "id STRING, n BIGINT, extra STRING"), "error", "breaks the compatibility"),
    ):
        response = api.post("/api/pipelines/preflight/", {"spec": body}, format="json")
        assert response.status_code == 200, response.json()
        [check] = [c for c in response.json()["checks"] if c["field"] == "sink.schema_registry"]
        assert check["status"] == status, check
        assert words in check["message"] and f"'{taken}-value'" in check["message"]


def test_a_registry_that_does_not_answer_refuses_the_save(api, kafka_connection):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    response = api.post(
        "/api/connections/",
        {
            "name": "registry",
            "kind": "schema-registry",
            "settings": {"url": f"http://127.0.0.1:{port}", "timeout_seconds": 2},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    response = save(api, "away", spec(fresh_topic(), "id STRING"))
    assert response.status_code == 400, response.json()
    [message] = response.json()[FIELD]
    assert "does not answer" in message
    # With a transform nothing is asked: the run asks.
    response = save(api, "later", spec(fresh_topic(), "id STRING", "SELECT id FROM source"))
    assert response.status_code == 201, response.json()
