"""Avro through a schema registry (source.schema_registry): records produced by Confluent's own
Python client (confluent-kafka's AvroSerializer, registering each schema version in the real
registry `./stack test` starts) in three versions of their schema, read by a pipeline exactly
once with the right values for each version; the reader schema taken from the registry when
the spec is saved, and a reader that cannot read what producers may write refused there; a
value with an unknown schema id, a corrupted header or a cut body becomes a dead letter (the
reason in words), never a failed batch. Real Kafka, registry, Spark and Postgres."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from jobs.registry.client import Registry
from jobs.runconfig import RunConfig
from jobs.sinks.postgres.store import DEAD_LETTERS_TABLE
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic
from tests.spark_helpers import drain, fetch, forget_last_commit

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

V1 = {
    "type": "record",
    "name": "Delivery",
    "namespace": "acme",
    "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "int"}],
}
# v2: n promoted to long, status added with a default.
V2 = {
    **V1,
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "long"},
        {"name": "status", "type": "string", "default": "created"},
    ],
}
# v3: n removed (v2's readers cannot read it: n has no default there), courier added.
V3 = {
    **V1,
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "status", "type": "string", "default": "created"},
        {"name": "courier", "type": ["null", "string"], "default": None},
    ],
}


def produce_versions(bootstrap: str, registry_url: str, topic: str) -> list[dict]:
    """Records of each version, as Confluent's AvroSerializer writes them (the schema
    registered under <topic>-value); the values each should read as, by id."""
    from confluent_kafka import SerializingProducer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import StringSerializer

    client = SchemaRegistryClient({"url": registry_url})
    expected = []
    for version, schema, records in (
        (1, V1, [{"id": f"v1-{i}", "n": i} for i in range(30)]),
        (2, V2, [{"id": f"v2-{i}", "n": 2**40 + i, "status": "assigned"} for i in range(30)]),
        (3, V3, [{"id": f"v3-{i}", "status": "delivered", "courier": "ann"} for i in range(30)]),
    ):
        producer = SerializingProducer(
            {
                "bootstrap.servers": bootstrap,
                "key.serializer": StringSerializer("utf_8"),
                "value.serializer": AvroSerializer(client, json.dumps(schema)),
            }
        )
        for r in records:
            producer.produce(topic, key=r["id"], value=r)
        producer.flush(30)
        for r in records:
            expected.append(
                {
                    "id": r["id"],
                    "status": r.get("status", "created"),
                    "courier": r.get("courier"),
                    "version": version,
                }
            )
    return expected


def read_avro(bootstrap: str, registry_url: str, topic: str, wanted: int) -> list[dict]:
    """Up to `wanted` values of `topic` as Confluent's DeserializingConsumer and
    AvroDeserializer read them (read_committed), within 60 s."""
    from confluent_kafka import DeserializingConsumer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    consumer = DeserializingConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "value.deserializer": AvroDeserializer(SchemaRegistryClient({"url": registry_url})),
        }
    )
    consumer.subscribe([topic])
    read = []
    try:
        deadline = time.monotonic() + 60
        while len(read) < wanted and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None and message.error() is None:
                read.append(message.value())
    finally:
        consumer.close()
    return read


def produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value=value)
    producer.flush(30)


def spec(topic: str, table: str, version="latest") -> dict:
    return {
        "source": {
            "connection": "events",
            "topics": [topic],
            "format": "avro",
            "avro_framing": "confluent",
            "schema_registry": {"connection": "registry", "version": version},
            "starting_offsets": "earliest",
            "max_records_per_batch": 40,
        },
        "sink": {"connection": "warehouse", "table": table},
    }


def run_config(pipeline_spec: dict, tmp_path, bootstrap, sink_dsn, registry_url) -> RunConfig:
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"reg-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(pipeline_spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
        registry={"url": registry_url, "auth": "none", "timeout_seconds": 10},
    )


def test_the_reader_schema_comes_from_the_registry_on_save_and_a_reader_that_cannot_read_is_refused(
    api, kafka_connection, postgres_connection, registry_connection, kafka_bootstrap, registry_url
):
    topic = new_topic(kafka_bootstrap)
    produce_versions(kafka_bootstrap, registry_url, topic)
    body = {"name": "reg-latest", "spec": spec(topic, "reg_latest")}
    response = api.post("/api/pipelines/", body, format="json")
    assert response.status_code == 201, response.json()
    source = response.json()["spec"]["source"]
    assert json.loads(source["avro_schema"])["fields"] == V3["fields"]
    assert source["schema"] == "`id` STRING, `status` STRING, `courier` STRING"
    registry = source["schema_registry"]
    assert (registry["subject"], registry["resolved_version"]) == (f"{topic}-value", 3)
    assert isinstance(registry["schema_id"], int)
    # Version 2 cannot read what version 3's producers write (n has no default in it).
    body = {"name": "reg-pinned", "spec": spec(topic, "reg_pinned", version=2)}
    response = api.post("/api/pipelines/", body, format="json")
    assert response.status_code == 400, response.json()
    errors = response.json()["spec.source.schema_registry.version"]
    assert any("cannot read" in e and "BACKWARD" in e for e in errors), errors
    # A subject the registry does not have, and a version it does not have.
    body = {"name": "reg-none", "spec": spec(new_topic(kafka_bootstrap), "reg_none")}
    response = api.post("/api/pipelines/", body, format="json")
    assert response.status_code == 400
    assert "has no subject" in " ".join(response.json()["spec.source.schema_registry"])
    body = {"name": "reg-v9", "spec": spec(topic, "reg_v9", version=9)}
    response = api.post("/api/pipelines/", body, format="json")
    assert "has no version 9" in " ".join(response.json()["spec.source.schema_registry"])


@pytest.mark.parametrize(
    ("strategy", "confluents", "subject_of"),
    [
        ("record", "record_subject_name_strategy", lambda topic: "acme.Delivery"),
        (
            "topic-record",
            "topic_record_subject_name_strategy",
            lambda topic: f"{topic}-acme.Delivery",
        ),
    ],
)
def test_the_record_strategies_find_the_subject_confluents_serializer_registers(
    api,
    kafka_connection,
    postgres_connection,
    registry_connection,
    kafka_bootstrap,
    registry_url,
    strategy,
    confluents,
    subject_of,
):
    import confluent_kafka.schema_registry as schema_registry
    from confluent_kafka import SerializingProducer
    from confluent_kafka.schema_registry import SchemaRegistryClient, avro

    topic = new_topic(kafka_bootstrap)
    # A record name of the test's own: the record strategy's subject is the same in every
    # topic (and every run against the same registry).
    name = f"Delivery{uuid.uuid4().hex[:8]}"
    schema = {**V2, "name": name}
    serializer = avro.AvroSerializer(
        SchemaRegistryClient({"url": registry_url}),
        json.dumps(schema),
        conf={"subject.name.strategy": getattr(schema_registry, confluents)},
    )
    producer = SerializingProducer(
        {"bootstrap.servers": kafka_bootstrap, "value.serializer": serializer}
    )
    producer.produce(topic, value={"id": "a", "n": 1, "status": "x"})
    producer.flush(30)
    wanted = subject_of(topic).replace("Delivery", name)
    with Registry({"url": registry_url}) as registry:
        assert registry.version(wanted).version == 1  # where Confluent's client put it

    body = spec(topic, f"reg_{strategy.replace('-', '_')}")
    body["source"]["schema_registry"].update(strategy=strategy, record=f"acme.{name}")
    response = api.post("/api/pipelines/", {"name": f"reg-{strategy}", "spec": body}, format="json")
    assert response.status_code == 201, response.json()
    found = response.json()["spec"]["source"]
    assert found["schema_registry"]["subject"] == wanted
    assert json.loads(found["avro_schema"])["fields"] == V2["fields"]
    # Without the record's name the strategy has no subject: said at the field.
    del body["source"]["schema_registry"]["record"]
    response = api.post("/api/pipelines/", {"name": "reg-no-record", "spec": body}, format="json")
    assert response.status_code == 400, response.json()
    assert any("record" in k for k in response.json()), response.json()


def test_a_rollback_restores_the_reader_schema_as_it_was_saved(
    api, kafka_connection, postgres_connection, registry_connection, kafka_bootstrap, registry_url
):
    topic = new_topic(kafka_bootstrap)
    with Registry({"url": registry_url}) as registry:
        registry.register(f"{topic}-value", json.dumps(V1))
        body = {"name": "reg-back", "spec": spec(topic, "reg_back")}
        response = api.post("/api/pipelines/", body, format="json")
        assert response.status_code == 201, response.json()
        registry.register(f"{topic}-value", json.dumps(V2))
    # Saved again: "latest" is version 2 now.
    response = api.patch("/api/pipelines/reg-back/", {"spec": body["spec"]}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["spec"]["source"]["schema_registry"]["resolved_version"] == 2
    # Back to version 1: its reader schema as it was saved (not the subject's latest now).
    response = api.post("/api/pipelines/reg-back/rollback/", {"version": 1}, format="json")
    assert response.status_code == 200, response.json()
    source = api.get("/api/pipelines/reg-back/").json()["spec"]["source"]
    assert source["schema_registry"]["resolved_version"] == 1
    assert json.loads(source["avro_schema"])["fields"] == V1["fields"]


def test_the_connection_is_tested_and_never_points_at_the_control_planes_own_services(
    api, registry_connection, settings
):
    response = api.post("/api/connections/registry/test/")
    assert response.status_code == 200, response.json()
    assert response.json()["ok"] is True, response.json()
    assert "compatibility BACKWARD" in response.json()["detail"], response.json()
    settings.CONTROLPLANE_URL = "http://127.0.0.1:8000"
    for url, what in (
        ("http://localhost:8000/api", "API"),
        (f"http://127.0.0.1:{_port(settings.CELERY_BROKER_URL, 6379)}", "broker"),
    ):
        response = api.post(
            "/api/connections/",
            {"name": "own", "kind": "schema-registry", "settings": {"url": url}},
            format="json",
        )
        assert response.status_code == 400, response.json()
        assert what in " ".join(response.json()["settings.url"]), response.json()
    response = api.post(
        "/api/connections/",
        {
            "name": "creds",
            "kind": "schema-registry",
            "settings": {"url": "http://user:pw@registry.example:8081"},
        },
        format="json",
    )
    assert response.status_code == 400
    assert "may not carry a user" in " ".join(response.json()["settings.url"])


def _port(url: str, default: int) -> int:
    from urllib.parse import urlsplit

    return urlsplit(url).port or default


@pytest.mark.spark
def test_three_versions_read_exactly_once_and_bad_values_are_dead_letters_with_reasons(
    api,
    kafka_connection,
    postgres_connection,
    registry_connection,
    kafka_bootstrap,
    registry_url,
    sink_dsn,
    spark,
    tmp_path,
):
    topic = new_topic(kafka_bootstrap)
    expected = produce_versions(kafka_bootstrap, registry_url, topic)
    with Registry({"url": registry_url}) as registry:
        v1 = registry.version(f"{topic}-value", 1).id
    bad = [
        b"\x00" + (999_999).to_bytes(4, "big") + b"\x02a\x02",  # an id the registry lacks
        b"\x01\x00\x00\x00\x01\x02a",  # not the magic byte
        b"\x00" + v1.to_bytes(4, "big") + b"\x06ab",  # version 1's header, its body cut short
    ]
    produce_raw(kafka_bootstrap, topic, bad)
    table = f"reg_{uuid.uuid4().hex[:8]}"
    response = api.post(
        "/api/pipelines/", {"name": "reg-run", "spec": spec(topic, table)}, format="json"
    )
    assert response.status_code == 201, response.json()
    cfg = run_config(response.json()["spec"], tmp_path, kafka_bootstrap, sink_dsn, registry_url)
    drain(spark, cfg)
    rows = fetch(sink_dsn, f'SELECT id, status, courier FROM "{table}" ORDER BY id')
    assert len(rows) == 90
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        e["id"]: (e["status"], e["courier"]) for e in expected
    }
    letters = dict(
        (bytes(raw), error)
        for raw, error in fetch(
            sink_dsn,
            f'SELECT raw, error FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s',
            cfg.pipeline,
        )
    )
    assert sorted(letters) == sorted(bad)
    # Each with its reason in words, as the executors' decoder gave it.
    assert "schema id 999999 is not in the schema registry" in letters[bad[0]], letters
    assert "its first byte is 1, not 0" in letters[bad[1]], letters
    assert letters[bad[2]].startswith(f"does not decode with writer schema id {v1}"), letters
    # Replayed (the driver died after the sink's transaction): nothing twice.
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, cfg)
    assert fetch(sink_dsn, f'SELECT count(*) FROM "{table}"')[0][0] == 90
    assert (
        fetch(
            sink_dsn,
            f'SELECT count(*) FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s',
            cfg.pipeline,
        )[0][0]
        == 3
    )


@pytest.mark.spark
def test_the_kafka_sink_writes_avro_that_confluents_deserializer_reads(
    kafka_bootstrap, registry_url, spark, tmp_path
):
    from tests.kafka_helpers import produce

    source, out, dead = (new_topic(kafka_bootstrap) for _ in range(3))
    events = [{"id": f"e{i}", "n": i, "note": None if i % 3 else f"note {i}"} for i in range(40)]
    produce(kafka_bootstrap, source, events)
    spec = {
        "source": {
            "connection": "k",
            "topics": [source],
            "schema": "id STRING, n BIGINT, note STRING",
            "starting_offsets": "earliest",
        },
        "sink": {
            "kind": "kafka",
            "connection": "k",
            "topic": out,
            "dead_letter_topic": dead,
            "key": "id",
            "format": "avro",
            "schema_registry": {"connection": "registry", "record": "acme.Event"},
        },
    }
    (tmp_path / "run").mkdir()
    registry = {"url": registry_url, "auth": "none", "timeout_seconds": 10}
    cfg = RunConfig(
        pipeline=f"reg-out-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [kafka_bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
        sink_configs=(
            {"kafka": {"bootstrap_servers": [kafka_bootstrap]}, "schema-registry": registry},
        ),
    )
    drain(spark, cfg)
    read = read_avro(kafka_bootstrap, registry_url, out, len(events))
    assert sorted(read, key=lambda r: r["n"]) == events
    # Registered under the topic's subject, as a record of the given name.
    with Registry({"url": registry_url}) as found:
        latest = json.loads(found.version(f"{out}-value").schema)
    assert (latest["name"], latest.get("namespace")) == ("Event", "acme")
