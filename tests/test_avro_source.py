"""Avro values (source.format avro), plain and with Confluent's header: real Kafka, Spark
(spark-avro's from_avro) and Postgres. Records that do not decode become dead letters,
exactly once like the rest."""

from __future__ import annotations

import io
import struct
import uuid

import fastavro
import pytest

from jobs.runconfig import RunConfig
from jobs.sinks.postgres.store import DEAD_LETTERS_TABLE
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import drain, fetch, forget_last_commit

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

SCHEMA = {
    "type": "record",
    "name": "Delivery",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": ["null", "int"], "default": None},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
# Every field optional: a record of nulls decodes, and must not be taken for a corrupt one.
OPTIONAL = {
    "type": "record",
    "name": "Loose",
    "fields": [{"name": "a", "type": ["null", "string"], "default": None}],
}


def encode(schema, record, *, confluent: bool = False, schema_id: int = 7) -> bytes:
    out = io.BytesIO()
    if confluent:
        out.write(b"\x00" + struct.pack(">I", schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def config(tmp_path, topic, sink_dsn, schema, framing="none", transform=None) -> RunConfig:
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "format": "avro",
            "avro_schema": schema,
            "avro_framing": framing,
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "pg", "table": f"avro_{uuid.uuid4().hex[:8]}"},
        "transform": transform,
    }
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"avro-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [pytest.kafka_bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
    )


@pytest.fixture(autouse=True)
def _bootstrap(kafka_bootstrap):
    pytest.kafka_bootstrap = kafka_bootstrap


@pytest.mark.parametrize("framing", ["none", "confluent"])
def test_avro_records_land_once_and_corrupt_ones_become_dead_letters(
    spark, kafka_bootstrap, sink_dsn, tmp_path, framing
):
    confluent = framing == "confluent"
    topic = new_topic(kafka_bootstrap)
    good = [
        encode(
            SCHEMA,
            {
                "id": f"d{i}",
                "n": None if i % 5 == 0 else i,
                "ts": 1_763_700_000_000 + i,
                "tags": ["a"] * (i % 3),
            },
            confluent=confluent,
        )
        for i in range(200)
    ]
    corrupt = [b"\x02", b"not avro at all, just text that runs on", b""]
    if confluent:
        corrupt.append(encode(SCHEMA, {"id": "x", "n": 1, "ts": 0, "tags": []}))  # no header
    produce(kafka_bootstrap, topic, good + corrupt)
    cfg = config(tmp_path, topic, sink_dsn, SCHEMA, framing)
    drain(spark, cfg)
    table = cfg.spec.sink.table
    rows = fetch(sink_dsn, f'SELECT id, n, ts, tags FROM "{table}" ORDER BY id')
    assert len(rows) == 200 and len({r[0] for r in rows}) == 200
    d7 = next(r for r in rows if r[0] == "d7")
    assert (d7[1], d7[2].timestamp(), d7[3]) == (7, 1_763_700_000.007, ["a"])
    assert next(r for r in rows if r[0] == "d5")[1] is None
    letters = fetch(
        sink_dsn,
        f'SELECT raw, error FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s',
        cfg.pipeline,
    )
    assert sorted(bytes(r[0] or b"") for r in letters) == sorted(corrupt)
    assert all("does not decode as Avro" in e or "empty value" in e for _, e in letters)

    # Replayed (the driver died after the sink's transaction): nothing twice.
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, cfg)
    assert fetch(sink_dsn, f'SELECT count(*) FROM "{table}"')[0][0] == 200


def test_a_record_of_nulls_is_a_record_not_a_dead_letter(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap)
    produce(
        kafka_bootstrap,
        topic,
        [encode(OPTIONAL, {"a": None}), encode(OPTIONAL, {"a": "x"}), b"\x09\x09\x09"],
    )
    cfg = config(tmp_path, topic, sink_dsn, OPTIONAL, transform={"sql": "SELECT a FROM source"})
    drain(spark, cfg)
    rows = fetch(sink_dsn, f'SELECT a FROM "{cfg.spec.sink.table}" ORDER BY a')
    assert rows == [("x",), (None,)]
    letters = fetch(
        sink_dsn, f'SELECT raw FROM "{DEAD_LETTERS_TABLE}" WHERE pipeline = %s', cfg.pipeline
    )
    assert [bytes(r[0]) for r in letters] == [b"\x09\x09\x09"]
