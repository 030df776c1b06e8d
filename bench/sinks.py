"""The sinks' throughput next to Spark's own sinks on the same data, in one run.

    .venv/bin/python bench/sinks.py [--events 1000000 --partitions 4 --rounds 3]
                                     (after ./stack services)

The same JSON delivery events (jobs.loadgen.produce, ~160 bytes) in one topic, read from its
start with Spark's Kafka connector, parsed with the pipeline's schema, written as one JSON
object per record keyed by delivery_id:

  kafka_exactly_once   the real pipeline (jobs.pipeline.start_query, availableNow, sink kind
                       kafka): each Spark task writes its partition in one Kafka transaction
                       with its marker (controlplane.spark.KafkaTxWriter); dead letters are
                       split off on the way (the topic holds none)
  kafka_at_least_once  the same parsed frame and the same records through Spark's own Kafka
                       sink (format "kafka", at-least-once: a replayed batch is written again)

Every round writes each path into a fresh output topic (as many partitions as the source),
alternating which goes first; after an unmeasured warm-up round, the medians of the rounds
are reported. A path's figure is rows / the sum of its batches' durations (query start-up and
the last, empty, batch excluded). Each exactly-once output is then read back with a
read_committed consumer and counted (every record once). Target: kafka_exactly_once >= 0.7x
kafka_at_least_once.

The file sink's figures (issue #17, item 2) are not here yet.

The last line is one JSON object with every figure, also written to bench/results/sinks.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402
    SCHEMA,
    bench_session,
    delete_topics,
    machine,
    timed_drain,
)
from jobs import jvm  # noqa: E402
from jobs.loadgen import produce  # noqa: E402
from jobs.pipeline import (  # noqa: E402
    KafkaBatchWriter,
    RunConfig,
    parsed_frame,
    source_frame,
    start_query,
)
from jobs.sinks.kafka import KEY, VALUE  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402

TARGETS = {"kafka_exactly_once_to_at_least_once": 0.7}
PATHS = ("kafka_exactly_once", "kafka_at_least_once")


def create_topic(bootstrap: str, partitions: int) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    name = f"bench-out-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    return name


def config_for(topic, out, dead, bootstrap, workdir: Path, per_batch: int) -> RunConfig:
    spec = parse_spec(
        {
            "source": {
                "connection": "k",
                "topics": [topic],
                "schema": SCHEMA,
                "starting_offsets": "earliest",
                "max_records_per_batch": per_batch,
                "reader": "spark-kafka",
            },
            "sink": {
                "kind": "kafka",
                "connection": "k",
                "topic": out,
                "dead_letter_topic": dead,
                "key": "delivery_id",
            },
        }
    )
    run_dir = workdir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    client = {"bootstrap_servers": [bootstrap]}
    return RunConfig(
        pipeline=f"bench-{uuid.uuid4().hex[:6]}",
        spec=spec,
        kafka=client,
        postgres={},
        checkpoint=str(workdir / "checkpoint"),
        run_dir=str(run_dir),
        sink_kafka=client,
    )


def exactly_once(spark, config: RunConfig) -> dict:
    return timed_drain(start_query(spark, config, available_now=True))


def at_least_once(spark, config: RunConfig, bootstrap: str) -> dict:
    """The same records (the writer's own key and value columns) through Spark's Kafka sink."""
    writer = KafkaBatchWriter(config)
    frame = parsed_frame(source_frame(spark, config), config.spec).select(
        *writer.one_pass_columns()
    )
    records = frame.select(*writer_columns(writer, frame)).selectExpr(
        f"{KEY} AS key", f"{VALUE} AS value"
    )
    query = (
        records.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", config.spec.sink.topic)
        .option("checkpointLocation", config.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    return timed_drain(query)


def writer_columns(writer: KafkaBatchWriter, frame) -> list:
    from jobs.sinks.kafka import RecordColumns

    return RecordColumns(writer.sink).columns(frame, writer.columns)[:2]


def read_committed_count(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
        max_partition_fetch_bytes=8 << 20,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        n = 0
        while True:
            batch = consumer.poll(timeout_ms=3000, max_records=100_000)
            if not batch:
                return n
            n += sum(len(records) for records in batch.values())
    finally:
        consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=250_000, help="max_records_per_batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "sinks.json"))
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jvm.build()

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    produce(bootstrap, topic, rate=0, count=args.events, partitions=args.partitions)
    print(f"produced {args.events:,} events in {time.perf_counter() - started:.1f} s", flush=True)
    dead = create_topic(bootstrap, 1)
    created = [topic, dead]

    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = bench_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    rates: dict[str, list[float]] = {p: [] for p in PATHS}
    read_back: list[int] = []
    try:
        for round_number in range(args.rounds + 1):
            order = PATHS if round_number % 2 == 0 else PATHS[::-1]
            for path in order:
                out = create_topic(bootstrap, args.partitions)
                created.append(out)
                with tempfile.TemporaryDirectory(prefix="bench-sinks-") as work:
                    config = config_for(topic, out, dead, bootstrap, Path(work), args.per_batch)
                    if path == "kafka_exactly_once":
                        figures = exactly_once(spark, config)
                    else:
                        figures = at_least_once(spark, config, bootstrap)
                rate = figures["rows"] / figures["seconds"]
                warm = " (warm-up, not counted)" if round_number == 0 else ""
                print(
                    f"round {round_number} {path}: {figures['rows']:,} rows in"
                    f" {figures['seconds']:.2f} s, {rate:,.0f} rows/s{warm}",
                    flush=True,
                )
                if figures["rows"] != args.events:
                    raise SystemExit(f"{path} read {figures['rows']} rows, not {args.events}")
                if round_number == 0:
                    continue
                rates[path].append(rate)
                if path == "kafka_exactly_once":
                    read_back.append(read_committed_count(bootstrap, out))
    finally:
        spark.stop()
        delete_topics(bootstrap, created)

    medians = {p: round(statistics.median(v)) for p, v in rates.items()}
    ratio = round(medians["kafka_exactly_once"] / medians["kafka_at_least_once"], 3)
    ratios = {"kafka_exactly_once_to_at_least_once": ratio}
    met = {name: ratios[name] >= target for name, target in TARGETS.items()}
    print()
    print(f"{'path':<22}{'rows/s (median)':>18}   rounds")
    for path in PATHS:
        print(f"{path:<22}{medians[path]:>18,}   {', '.join(f'{r:,.0f}' for r in rates[path])}")
    print(
        f"exactly once / at least once: {ratio}x (target >= {TARGETS[next(iter(TARGETS))]}x:"
        f" {'met' if all(met.values()) else 'NOT met'})"
    )
    print(f"read back with read_committed (each round's exactly-once output): {read_back}")
    result = {
        "machine": machine(),
        "events": args.events,
        "partitions": args.partitions,
        "per_batch": args.per_batch,
        "rounds": args.rounds,
        "master": args.master,
        "events_per_s": medians,
        "events_per_s_rounds": {p: [round(r) for r in v] for p, v in rates.items()},
        "ratios": ratios,
        "targets": TARGETS,
        "met": met,
        "exactly_once_read_back": read_back,
        "exactly_once_read_back_ok": all(n == args.events for n in read_back),
    }
    line = json.dumps(result)
    Path(args.output).write_text(line + "\n")
    print(line)
    return 0 if all(met.values()) and result["exactly_once_read_back_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
