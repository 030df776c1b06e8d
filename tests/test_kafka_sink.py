"""Kafka -> Spark -> Kafka, exactly once (jobs.sinks.kafka.client, KafkaTxWriter): real Kafka and
Spark. The output is read as a downstream consumer would: `read_committed`."""

from __future__ import annotations

import json
import uuid

import pytest

from jobs.batch import stream_id
from jobs.pipeline import start_query
from jobs.runconfig import RunConfig
from jobs.sinks.kafka.client import KafkaWriter, transactional_prefix
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce, read_committed
from tests.spark_helpers import drain, failure, forget_last_commit

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

READERS = ["spark-kafka", "python"]
MALFORMED = [b"not json", b'{"id": "m1", "n": ', b'{"id": "m2", "n": "lots"}']


def kafka_sink_config(tmp_path, bootstrap, source_topic, out, dead, *, reader=None, **sink):
    transform = sink.pop("transform", None)
    spec = {
        "source": {
            "connection": "k",
            "topics": [source_topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
            "max_records_per_batch": 250,
            "reader": reader,
        },
        "sink": {
            "kind": "kafka",
            "connection": "k",
            "topic": out,
            "dead_letter_topic": dead,
            **sink,
        },
        "transform": transform,
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    client = {"bootstrap_servers": [bootstrap]}
    return RunConfig(
        pipeline=f"k-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka=client,
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(run_dir),
        sink_kafka=client,
    )


def values(records):
    return sorted(json.loads(v)["id"] for _, v, _ in records)


def topics(bootstrap):
    return new_topic(bootstrap), new_topic(bootstrap), new_topic(bootstrap)


@pytest.mark.parametrize("reader", READERS)
def test_records_land_once_with_key_headers_and_dead_letters_in_the_same_transaction(
    spark, kafka_bootstrap, tmp_path, reader
):
    source, out, dead = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": f"e{i}", "n": i} for i in range(600)))
    produce(kafka_bootstrap, source, MALFORMED, start=600)
    config = kafka_sink_config(
        tmp_path,
        kafka_bootstrap,
        source,
        out,
        dead,
        reader=reader,
        key="id",
        headers={"origin": "'orders'", "n": "n"},
    )
    drain(spark, config)
    records = read_committed(kafka_bootstrap, out)
    assert values(records) == sorted(f"e{i}" for i in range(600))
    key, value, headers = next(r for r in records if json.loads(r[1])["id"] == "e7")
    assert (key, json.loads(value)) == (b"e7", {"id": "e7", "n": 7})
    assert headers == {"origin": b"orders", "n": b"7"}
    letters = read_committed(kafka_bootstrap, dead)
    assert sorted(v for _, v, _ in letters) == sorted(MALFORMED)
    for _, _, h in letters:
        assert h["cp-source-topic"] == source.encode()
        assert b"does not parse as JSON" in h["cp-error"]
    # Nothing was written outside a committed transaction: read_uncommitted sees the same.
    assert len(read_committed(kafka_bootstrap, out, isolation="read_uncommitted")) >= 600


@pytest.mark.parametrize("reader", READERS)
def test_a_replayed_batch_is_skipped_by_its_markers(spark, kafka_bootstrap, tmp_path, reader):
    """The driver died after the batch's transactions committed, before Spark's commit log:
    the replay finds every part's marker and writes nothing twice."""
    source, out, dead = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": f"e{i}", "n": i} for i in range(400)))
    config = kafka_sink_config(tmp_path, kafka_bootstrap, source, out, dead, reader=reader)
    drain(spark, config)
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, config)
    assert values(read_committed(kafka_bootstrap, out)) == sorted(f"e{i}" for i in range(400))
    # The markers: per source partition (Spark's connector) the end of the offsets written.
    writer = KafkaWriter(
        spark, pipeline=config.pipeline, sink=config.spec.sink, client=config.sink_kafka
    )
    stream = stream_id(config.checkpoint)
    if reader == "spark-kafka":
        found = writer.committed(stream, [f"{source}-{p}" for p in range(3)])
        assert sum(found.values()) == 400, found
    else:
        assert writer.committed(stream, ["p0"]), "no marker for the first part"
    assert transactional_prefix(config.pipeline, stream).startswith(f"cp.{config.pipeline}.")


def test_a_transform_writes_its_output_and_the_dead_letters_with_markers_of_their_own(
    spark, kafka_bootstrap, tmp_path
):
    source, out, dead = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": f"e{i}", "n": i} for i in range(300)))
    produce(kafka_bootstrap, source, MALFORMED, start=300)
    config = kafka_sink_config(
        tmp_path,
        kafka_bootstrap,
        source,
        out,
        dead,
        transform={"sql": "SELECT id, n * 2 AS doubled FROM source WHERE n % 3 = 0"},
        value="named_struct('id', id, 'doubled', doubled)",
    )
    drain(spark, config)
    records = read_committed(kafka_bootstrap, out)
    assert values(records) == sorted(f"e{i}" for i in range(0, 300, 3))
    assert {json.loads(v)["doubled"] for _, v, _ in records} == {i * 2 for i in range(0, 300, 3)}
    letters = read_committed(kafka_bootstrap, dead)
    assert sorted(v for _, v, _ in letters) == sorted(MALFORMED)
    # Replayed: neither the output nor the dead letters twice.
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, config)
    assert len(read_committed(kafka_bootstrap, out)) == 100
    assert len(read_committed(kafka_bootstrap, dead)) == 3


def test_a_shuffling_transform_writes_by_partition_number_once(spark, kafka_bootstrap, tmp_path):
    source, out, dead = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": f"e{i % 50}", "n": i} for i in range(500)))
    config = kafka_sink_config(
        tmp_path,
        kafka_bootstrap,
        source,
        out,
        dead,
        transform={"sql": "SELECT id, count(*) AS c FROM source GROUP BY id"},
        key="id",
    )
    drain(spark, config)
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, config)
    records = read_committed(kafka_bootstrap, out)
    totals: dict[str, int] = {}
    for _, v, _ in records:
        row = json.loads(v)
        totals[row["id"]] = totals.get(row["id"], 0) + row["c"]
    assert totals == {f"e{i}": 10 for i in range(50)}


def test_a_transform_a_replay_could_plan_otherwise_is_refused(spark, kafka_bootstrap, tmp_path):
    source, out, dead = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": f"e{i}", "n": i} for i in range(10)))
    config = kafka_sink_config(
        tmp_path,
        kafka_bootstrap,
        source,
        out,
        dead,
        transform={"sql": "SELECT /*+ COALESCE(1) */ id, n FROM source"},
    )
    error = failure(spark, config)
    assert "KafkaSinkError" in error and "COALESCE" in error
    assert read_committed(kafka_bootstrap, out) == []


def test_a_missing_topic_is_a_definition_error_naming_it(spark, kafka_bootstrap, tmp_path):
    source, out, _ = topics(kafka_bootstrap)
    produce(kafka_bootstrap, source, ({"id": "a", "n": 1},))
    config = kafka_sink_config(tmp_path, kafka_bootstrap, source, out, "no-such-topic-here")
    error = failure(spark, config)
    assert "MissingSinkTopic" in error and "'no-such-topic-here' does not exist" in error


def test_two_sinks_each_write_once_and_the_one_that_failed_resumes_where_it_committed(
    spark, kafka_bootstrap, sink_dsn, tmp_path, monkeypatch
):
    """sinks: [postgres, kafka]. The Kafka sink fails on batch 1 after the Postgres sink
    committed it: the run fails; started again, the batch is replayed, the Postgres sink
    skips it (its markers) and the Kafka sink writes it. Dead letters go with the first sink
    only."""
    import dataclasses

    import psycopg

    from jobs.sinks.kafka import client as kafka_sink

    source, out, dead = topics(kafka_bootstrap)
    table = f"two_{uuid.uuid4().hex[:8]}"
    produce(kafka_bootstrap, source, ({"id": f"e{i}", "n": i} for i in range(600)))
    produce(kafka_bootstrap, source, MALFORMED, start=600)
    base = kafka_sink_config(tmp_path, kafka_bootstrap, source, out, dead, key="id")
    spec = base.spec.to_dict()
    spec["sinks"] = [{"connection": "pg", "table": table}, spec.pop("sink")]
    client = {"bootstrap_servers": [kafka_bootstrap]}
    config = dataclasses.replace(
        base,
        spec=parse_spec(spec),
        sink_configs=({"postgres": {"conninfo": sink_dsn}}, {"kafka": client}),
    )
    real = kafka_sink.KafkaWriter.write

    def fails_on_batch_1(self, frame, batch_id, *args, **kwargs):
        if batch_id == 1:
            raise RuntimeError("the Kafka sink is down")
        return real(self, frame, batch_id, *args, **kwargs)

    monkeypatch.setattr(kafka_sink.KafkaWriter, "write", fails_on_batch_1)
    query = start_query(spark, config, available_now=True)
    with pytest.raises(Exception, match="the Kafka sink is down"):
        query.awaitTermination(180)

    def rows():
        with psycopg.connect(sink_dsn) as conn:
            return conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"').fetchone()

    # Batches 0 and 1 (250 offsets each) are in Postgres, only batch 0 is in Kafka.
    in_postgres, in_kafka = rows()[0], len(read_committed(kafka_bootstrap, out))
    assert in_postgres >= 495 and 245 <= in_kafka <= 250, (in_postgres, in_kafka)
    monkeypatch.setattr(kafka_sink.KafkaWriter, "write", real)
    drain(spark, config)
    assert rows() == (600, 600)
    assert values(read_committed(kafka_bootstrap, out)) == sorted(f"e{i}" for i in range(600))
    with psycopg.connect(sink_dsn) as conn:
        (letters,) = conn.execute(
            "SELECT count(*) FROM _cp_dead_letters WHERE pipeline = %s", (config.pipeline,)
        ).fetchone()
    assert letters == 3  # the first sink's
    assert read_committed(kafka_bootstrap, dead) == []
