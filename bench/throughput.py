"""Kafka -> Spark -> Postgres throughput, next to two baselines measured in the same run.

    .venv/bin/python bench/throughput.py [--events 500000 --rounds 3]   (after ./stack services)

Figures, all for ~200-byte JSON delivery events on this machine:
  raw       one kafka-python consumer reading every record (no Spark): the source ceiling
  noop      the pipeline (cp_kafka source, from_json, the frame of rows and dead letters the
            sink gets) into Spark's no-op sink instead of Postgres
  postgres  the same pipeline into Postgres, exactly once (commit markers, COPY), written by
            the executors' JVM (jobs/java) when its jar is built, else from Python workers
plus the driver's start-up time to a SparkSession and the JVM's peak resident memory. The
last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jobs import jvm  # noqa: E402
from jobs.loadgen import produce  # noqa: E402
from jobs.pipeline import (  # noqa: E402
    BatchWriter,
    RunConfig,
    for_jvm,
    parsed_frame,
    register_sources,
    source_frame,
    start_query,
)
from jobs.spec import parse_spec  # noqa: E402

SCHEMA = (
    "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE, lon DOUBLE, "
    "event_time TIMESTAMP"
)
# For the Postgres path with a transform (which caches each batch to write its dead letters
# and the transform's output from one read of Kafka). Without a transform, the Postgres path
# writes rows and dead letters in one pass.
TRANSFORM = (
    "SELECT delivery_id, courier_id, status, lat, lon, event_time FROM source WHERE lat IS NOT NULL"
)


def raw_reader(bootstrap: str, topic: str, partitions: int, expected: int) -> float:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
        max_partition_fetch_bytes=8 * 1024 * 1024,
        max_poll_records=50_000,
    )
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    consumer.seek_to_beginning()
    seen = 0
    started = time.perf_counter()
    while seen < expected:
        seen += sum(len(r) for r in consumer.poll(timeout_ms=500).values())
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def config_for(
    topic, bootstrap, sink_dsn, workdir: Path, per_batch: int, transform: str | None = None
) -> RunConfig:
    spec = parse_spec(
        {
            "source": {
                "connection": "k",
                "topics": [topic],
                "schema": SCHEMA,
                "starting_offsets": "earliest",
                "max_records_per_batch": per_batch,
            },
            "transform": {"sql": transform} if transform else None,
            "sink": {"connection": "pg", "table": f"bench_{uuid.uuid4().hex[:8]}"},
        }
    )
    run_dir = workdir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"bench-{uuid.uuid4().hex[:6]}",
        spec=spec,
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(workdir / "checkpoint"),
        run_dir=str(run_dir),
    )


def timed_drain(query) -> tuple[int, float]:
    """Rows and seconds from the first batch's start to the last batch's end."""
    query.awaitTermination()
    if query.exception():
        raise query.exception()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in batches)
    seconds = sum(p["batchDuration"] for p in batches) / 1000
    return rows, seconds


def noop_pipeline(spark, config: RunConfig) -> tuple[int, float]:
    """The Postgres path's query, up to the frame its writer gets, into the no-op sink.

    The same foreachBatch shape as the Postgres path on purpose: written as one streaming SQL
    query instead (parse, filter the corrupt records, select), Spark's optimiser evaluates
    from_json once per reference, parsing every record two or three times, and the no-op
    figure would flatter the sink."""
    writer = BatchWriter(config)

    def to_noop(batch, batch_id: int) -> None:
        frame = batch.select(*writer.one_pass_columns())
        for_jvm(frame, writer.columns).write.format("noop").mode("overwrite").save()

    register_sources(spark)
    query = (
        parsed_frame(source_frame(spark, config), config.spec)
        .writeStream.foreachBatch(to_noop)
        .option("checkpointLocation", config.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    return timed_drain(query)


class WriterPaths(logging.Handler):
    """How the Postgres path wrote its batches, from the job's log lines."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.paths: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        match = re.search(r" rows \((.*)\)", record.getMessage())
        if match:
            self.paths.add(match.group(1))


def peak_rss_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM), from /proc."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def python_workers_peak_rss_mb(jvm_pid: int) -> tuple[int, float]:
    """Spark's Python workers (the daemon's reused forks): how many, and the sum of their
    peaks, an upper bound of what they held at once."""
    peaks = [peak_rss_mb(pid) or 0 for pid in descendants(jvm_pid)]
    return len(peaks), sum(peaks)


def postgres_settings(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return ", ".join(
            f"{name}={conn.execute(f'SHOW {name}').fetchone()[0]}"
            for name in ("fsync", "synchronous_commit", "shared_buffers")
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--per-batch", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-up", type=int, default=200_000, help="events per path, first")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    sink_dsn = os.environ["CONTROLPLANE_SINK_DATABASE_URL"]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    produce(bootstrap, topic, rate=0, count=args.events, partitions=args.partitions)
    warm_topic = f"{topic}-warm-up"
    produce(bootstrap, warm_topic, rate=0, count=args.warm_up, partitions=args.partitions)
    print(f"produced {args.events} events in {time.perf_counter() - started:.1f} s", flush=True)

    from pyspark.sql import SparkSession

    jvm.build()  # the sink's JVM writer (a no-op when up to date)
    paths = WriterPaths()
    logging.getLogger("jobs.pipeline").addHandler(paths)
    logging.getLogger("jobs.pipeline").setLevel(logging.INFO)

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", ",".join(jvm.spark_jars()))
        .getOrCreate()
    )
    startup = time.perf_counter() - started
    print(f"driver start to SparkSession:   {startup:>10.1f} s", flush=True)

    figures: dict[str, list[float]] = {
        "raw": [],
        "noop": [],
        "postgres": [],
        "postgres_transform": [],
        "ratio": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Warm-up of both paths: the first batches pay for Python worker start-up, imports
        # and the JVM's JIT compilation of each path; what is measured is the steady state.
        per_batch = max(1, args.warm_up // 2)
        noop_pipeline(spark, config_for(warm_topic, bootstrap, sink_dsn, work / "w1", per_batch))
        warm = config_for(warm_topic, bootstrap, sink_dsn, work / "w2", per_batch)
        timed_drain(start_query(spark, warm, available_now=True))
        # Rounds of all three, back to back: a shared machine's speed drifts, so each ratio
        # compares figures taken seconds apart, and the medians are reported.
        for round_ in range(1, args.rounds + 1):
            raw = raw_reader(bootstrap, topic, args.partitions, args.events)
            rows, seconds = noop_pipeline(
                spark,
                config_for(topic, bootstrap, sink_dsn, work / f"noop{round_}", args.per_batch),
            )
            noop = rows / seconds
            config = config_for(topic, bootstrap, sink_dsn, work / f"pg{round_}", args.per_batch)
            rows, seconds = timed_drain(start_query(spark, config, available_now=True))
            pg = rows / seconds
            config = config_for(
                topic, bootstrap, sink_dsn, work / f"pgt{round_}", args.per_batch, TRANSFORM
            )
            rows, seconds = timed_drain(start_query(spark, config, available_now=True))
            pg_transform = rows / seconds
            for name, value in (
                ("raw", raw),
                ("noop", noop),
                ("postgres", pg),
                ("postgres_transform", pg_transform),
            ):
                figures[name].append(value)
            figures["ratio"].append(pg / noop)
            print(
                f"round {round_}: raw {raw:,.0f}/s, no-op sink {noop:,.0f}/s, Postgres exactly"
                f" once {pg:,.0f}/s (with a transform {pg_transform:,.0f}/s),"
                f" ratio {pg / noop:.2f}",
                flush=True,
            )
    raw, noop, pg, pg_transform, ratio = (statistics.median(figures[k]) for k in figures)
    print(f"raw kafka-python reader:        {raw:>10,.0f} events/s (median)")
    print(f"pipeline -> no-op sink:         {noop:>10,.0f} events/s (median)")
    print(f"pipeline -> Postgres, exactly once: {pg:>6,.0f} events/s (median)")
    print(f"  the same with a SQL transform:  {pg_transform:>8,.0f} events/s (median)")
    jvm_pid = spark._jvm.ProcessHandle.current().pid()
    peak = peak_rss_mb(jvm_pid)
    workers, workers_peak = python_workers_peak_rss_mb(jvm_pid)
    print(f"driver JVM peak RSS:            {peak or 0:>10,.0f} MB")
    print(f"Python workers peak RSS:        {workers_peak:>10,.0f} MB (sum over {workers})")
    print(f"sink Postgres:                  {postgres_settings(sink_dsn)}")
    print(f"Postgres writes:                {'; '.join(sorted(paths.paths))}")
    print(f"postgres / noop ratio:          {ratio:>10.2f} (median of the rounds' ratios)")
    spark.stop()
    print(
        json.dumps(
            {
                "events": args.events,
                "raw_events_per_s": round(raw),
                "noop_events_per_s": round(noop),
                "postgres_events_per_s": round(pg),
                "postgres_with_transform_events_per_s": round(pg_transform),
                "postgres_to_noop": round(ratio, 3),
                "postgres_writes": sorted(paths.paths),
                "rounds": args.rounds,
                "driver_startup_s": round(startup, 2),
                "driver_jvm_peak_rss_mb": round(peak) if peak else None,
                "python_workers_peak_rss_mb": round(workers_peak),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
