"""The writer schemas a schema-registry source's topics hold, as the metrics collector samples
them: records produced by Confluent's own client (AvroSerializer, the real registry) in one
version, then a second; the pipeline page and the API show the subject, the reader's
version and each writer schema with its version; a new one is flagged when it appears, and
the `writer-schema` alert rule fires; values not in the wire format and ids the registry
lacks are shown as such. Real Kafka, registry and Postgres; no Spark (nothing runs: the
topics are sampled whether the job runs or not)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertRule
from controlplane.definitions.models import Pipeline, WriterSchema
from controlplane.observability import writer_schemas
from controlplane.observability.collector import collect
from controlplane.observability.writer_sampling import TAIL
from jobs.registry.client import Registry
from tests.kafka_helpers import new_topic
from tests.test_avro_registry import V1, V2, V3, produce_raw, spec

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def produce(bootstrap: str, registry_url: str, topic: str, schema: dict, records: list[dict]):
    from confluent_kafka import SerializingProducer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    producer = SerializingProducer(
        {
            "bootstrap.servers": bootstrap,
            "value.serializer": AvroSerializer(
                SchemaRegistryClient({"url": registry_url}), json.dumps(schema)
            ),
        }
    )
    for i, r in enumerate(records):
        producer.produce(topic, value=r, partition=i % 2)  # both partitions, evenly
    producer.flush(30)


def test_writer_versions_are_sampled_shown_and_a_new_one_alerts(
    api,
    editor,
    kafka_connection,
    postgres_connection,
    registry_connection,
    kafka_bootstrap,
    registry_url,
    monkeypatch,
):
    # Every record of the sample read, however busy the machine (what is counted is exact).
    monkeypatch.setattr(writer_schemas, "READ_SECONDS", 60.0)
    monkeypatch.setattr(writer_schemas, "ROUND_SECONDS", 120.0)
    topic = new_topic(kafka_bootstrap, partitions=2)
    subject = f"{topic}-value"
    produce(kafka_bootstrap, registry_url, topic, V1, [{"id": f"a{i}", "n": i} for i in range(40)])
    produce(kafka_bootstrap, registry_url, topic, V2, [{"id": "b", "n": 1, "status": "x"}] * 30)
    with Registry({"url": registry_url}) as registry:
        ids = {v: registry.version(subject, v).id for v in (1, 2)}
    body = {"name": "writers", "spec": spec(topic, "writers")}
    response = api.post("/api/pipelines/", body, format="json")
    assert response.status_code == 201, response.json()
    pipeline = Pipeline.objects.get(name="writers")
    AlertRule.objects.create(name="new-writers", kind="writer-schema", params={"minutes": 30})

    now = timezone.now()
    collect(now)
    # The first sample: the newest TAIL records of each partition (version
    # 2's, produced last: 30 over 2 partitions), nothing flagged as new.
    rows = {r.schema_id: r for r in WriterSchema.objects.filter(pipeline=pipeline)}
    assert set(rows) == {ids[2]}, rows
    assert (rows[ids[2]].subject, rows[ids[2]].version) == (subject, 2)
    assert rows[ids[2]].records == 2 * TAIL
    assert rows[ids[2]].appeared_at is None
    engine.evaluate(now)
    assert not Alert.objects.filter(rule__name="new-writers").exists()

    # Not due again yet: nothing sampled (the records stay for the next sample).
    produce(kafka_bootstrap, registry_url, topic, V3, [{"id": "c", "status": "y"}] * 3)
    produce_raw(kafka_bootstrap, topic, [b"\x01not-framed", b"\x00" + (999_998).to_bytes(4, "big")])
    collect(now + timedelta(seconds=5))
    assert WriterSchema.objects.filter(pipeline=pipeline).count() == 1

    # Due: what was written since the first sample, and only that.
    later = now + timedelta(seconds=writer_schemas.SAMPLE_SECONDS + 1)
    collect(later)
    rows = {r.schema_id: r for r in WriterSchema.objects.filter(pipeline=pipeline)}
    with Registry({"url": registry_url}) as registry:
        ids[3] = registry.version(subject, 3).id
    assert set(rows) == {ids[2], ids[3], None, 999_998}, rows
    assert rows[ids[2]].records == 2 * TAIL  # none of version 2 since
    assert (rows[ids[3]].version, rows[ids[3]].records, rows[ids[3]].appeared_at) == (
        3,
        3,
        later,
    )
    assert (rows[None].records, rows[999_998].records) == (1, 1)
    assert rows[999_998].looked_up and rows[999_998].version is None

    # The alert rule: the new version, in words.
    engine.evaluate(later)
    alert = Alert.objects.get(rule__name="new-writers")
    assert (alert.subject, alert.state) == ("writers", "firing")
    assert f"version 3 of '{subject}' (id {ids[3]}), the pipeline reads version 2" in (
        alert.message
    ), alert.message

    # The API and the page.
    found = api.get("/api/pipelines/writers/writer-schemas/").json()
    assert (found["subject"], found["reader_version"], found["pinned"]) == (subject, 2, False)
    by_id = {w["schema_id"]: w for w in found["writers"]}
    assert by_id[ids[3]]["compared"] == "newer than the reader: fields it adds are not read"
    assert by_id[ids[2]]["compared"] == "the reader's version"
    assert by_id[None]["compared"] == "not in Confluent's wire format: dead letters"
    assert by_id[999_998]["compared"].startswith("not registered as a version of any subject")
    assert by_id[ids[3]]["new"] and not by_id[ids[2]]["new"]
    page = editor.get("/pipelines/writers/").content.decode()
    assert f'data-writer-appeared="{ids[3]}"' in page
    assert f'data-writer-schema="{ids[2]}"' in page

    # A pipeline that reads no registry has none.
    plain = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING",
        },
        "sink": {"connection": "warehouse", "table": "plain"},
    }
    assert (
        api.post("/api/pipelines/", {"name": "plain", "spec": plain}, format="json").status_code
        == 201
    )
    assert api.get("/api/pipelines/plain/writer-schemas/").status_code == 404


def test_record_prefixes_start_at_the_log_start_and_step_over_transaction_markers(
    kafka_bootstrap,
):
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

    from controlplane.observability import kafka_lookups
    from jobs.kafka.metadata import record_prefixes

    topic = new_topic(kafka_bootstrap, partitions=1)
    tp = TopicPartition(topic, 0)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(10):
        producer.send(topic, value=b"\x00" + i.to_bytes(4, "big") + b"body", partition=0)
    producer.flush()
    producer.close()
    # Records 0-5 deleted (as retention would): the log starts at 6.
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.delete_records({tp: 6})
    finally:
        admin.close()
    # Then a transaction: its records and its commit marker (an offset with no record).
    tx = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{topic}")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send(topic, value=b"\x00\x00\x00\x00\x2a", partition=0)
    tx.commit_transaction()
    tx.close()
    config = {"bootstrap_servers": [kafka_bootstrap]}
    consumer = kafka_lookups.acquire(config)
    try:
        end = consumer.end_offsets([tp])[tp]
        assert end == 12  # 10 records, 1 in the transaction, its marker
        read = record_prefixes(consumer, {tp: (2, end)}, prefix_bytes=5, seconds=30)
    finally:
        kafka_lookups.release(config, consumer, healthy=True)
    prefixes, reached = read[tp]
    assert [int.from_bytes(p[1:5], "big") for p in prefixes] == [6, 7, 8, 9, 42]
    assert reached == end  # past the marker too: the next sample starts at the end


def test_ids_beyond_the_cap_are_counted_not_kept_and_unknown_ids_never_alert(
    api,
    kafka_connection,
    postgres_connection,
    registry_connection,
    kafka_bootstrap,
    registry_url,
    monkeypatch,
):
    monkeypatch.setattr(writer_schemas, "READ_SECONDS", 60.0)
    monkeypatch.setattr(writer_schemas, "ROUND_SECONDS", 120.0)
    monkeypatch.setattr(writer_schemas, "MAX_IDS", 3)
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, registry_url, topic, V1, [{"id": "a", "n": 1}] * 2)
    body = {"name": "capped", "spec": spec(topic, "capped")}
    assert api.post("/api/pipelines/", body, format="json").status_code == 201
    AlertRule.objects.create(name="new-writers", kind="writer-schema", params={"minutes": 30})
    now = timezone.now()
    collect(now)
    # A producer writing raw Avro: bodies that start with a zero byte read as framed ids.
    unknown = [b"\x00" + (900_000 + i).to_bytes(4, "big") + b"\x02" for i in range(6)]
    produce_raw(kafka_bootstrap, topic, unknown)
    later = now + timedelta(seconds=writer_schemas.SAMPLE_SECONDS + 1)
    collect(later)
    pipeline = Pipeline.objects.get(name="capped")
    rows = list(WriterSchema.objects.filter(pipeline=pipeline).exclude(schema_id=None))
    assert len(rows) == 3, rows  # the one of version 1, and 2 of the 6 unknown
    assert all(r.looked_up and r.appeared_at is None for r in rows if r.version is None), rows
    engine.evaluate(later)
    assert not Alert.objects.filter(rule__name="new-writers").exists()
