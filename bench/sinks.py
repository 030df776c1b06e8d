"""The sinks' throughput next to Spark's own sinks on the same data, in one run.

    .venv/bin/python bench/sinks.py [--events 2000000 --partitions 4 --rounds 4 --minutes 10
                                     --rate 8000 --target-mb 4]
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

Files, in two parts (the same parsed columns; Parquet, Spark's default format):

  files_rolling   the real pipeline (sink kind files): each batch staged, rolled into
                  finished files by size by the driver's rolling thread (jobs.sinks.files.store)
  files_plain     Spark's own file sink (format "parquet", a file per task per batch)

1. Throughput: each path drains the same topic as above (availableNow), rounds alternating,
   medians reported. files_rolling's figure counts the rolls that happen meanwhile and adds
   the final roll of what is left (flush): every row in a finished file at the end. Target:
   files_rolling >= 0.8x files_plain.
2. Files after --minutes (10) at a 1 s trigger: a producer sends --rate events per second
   (jobs.loadgen, delivery events) into a fresh topic while both paths run side by side in one
   Spark session, partitioned by status (5 values), files_rolling with a --target-mb target
   (max age and inactivity longer than the run). Then: the number of files each made, per
   partition and in all, and their median size; files_rolling's rows not yet finished (staged,
   waiting for more) reported beside. Target: files_rolling's median finished file within 20%
   of the target size.

The last line is one JSON object with every figure, also written to bench/results/sinks.json.
"""

from __future__ import annotations

import argparse
import collections
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

from bench import cassandra_sink  # noqa: E402
from bench.throughput import (  # noqa: E402
    bench_config,
    bench_session,
    bench_source,
    delete_topics,
    files_spec,
    machine,
    timed_drain,
)
from jobs import jvm  # noqa: E402
from jobs.batch import Batch  # noqa: E402
from jobs.loadgen import produce  # noqa: E402
from jobs.pipeline import start_query  # noqa: E402
from jobs.runconfig import RunConfig  # noqa: E402
from jobs.sinks.kafka.client import KEY, VALUE  # noqa: E402
from jobs.source import parsed_frame, source_frame  # noqa: E402

TARGETS = {"kafka_exactly_once_to_at_least_once": 0.7, "files_rolling_to_plain": 0.8}
# files_rolling's median finished file / the target size: within 20%.
FILE_SIZE_BAND = (0.8, 1.2)
PATHS = ("kafka_exactly_once", "kafka_at_least_once")
FILE_PATHS = ("files_rolling", "files_plain")


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
    spec = {
        "source": bench_source(topic, per_batch),
        "sink": {
            "kind": "kafka",
            "connection": "k",
            "topic": out,
            "dead_letter_topic": dead,
            "key": "delivery_id",
        },
    }
    client = {"bootstrap_servers": [bootstrap]}
    return bench_config(spec, workdir, bootstrap, "bench", sink_kafka=client)


def exactly_once(spark, config: RunConfig) -> dict:
    return timed_drain(start_query(spark, config, available_now=True))


def at_least_once(spark, config: RunConfig, bootstrap: str) -> dict:
    """The same records (the writer's own key and value columns) through Spark's Kafka sink."""
    writer = Batch(config)
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


def writer_columns(writer: Batch, frame) -> list:
    from jobs.sinks.kafka.client import RecordColumns

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


def files_config(
    topic: str,
    workdir: Path,
    per_batch: int,
    *,
    target_mb: int,
    partition_by: tuple[str, ...] = (),
    trigger_seconds: float = 0,
    bootstrap: str,
) -> RunConfig:
    spec = files_spec(
        topic,
        per_batch,
        target_mb=target_mb,
        partition_by=partition_by,
        trigger_seconds=trigger_seconds,
    )
    (workdir / "lake").mkdir(parents=True, exist_ok=True)
    lake = {"files": {"root": (workdir / "lake").as_uri()}}
    return bench_config(spec, workdir, bootstrap, "bench", sink_configs=(lake,))


def rolling_sink(spark, config: RunConfig):
    from jobs.batch import stream_id
    from jobs.sinks.files import store as files

    root = config.sink_configs[0]["files"]["root"]
    return files.FilesStore(
        spark,
        files.base_uri(root, config.spec.sink.path),
        config.spec.sink,
        stream_id(config.checkpoint),
    )


def files_rolling(spark, config: RunConfig) -> dict:
    """The pipeline's drain, then the roll of what is left: every row finished."""
    figures = timed_drain(start_query(spark, config, available_now=True))
    started = time.perf_counter()
    rolling_sink(spark, config).roll(time.time(), flush=True)
    figures["seconds"] += time.perf_counter() - started
    base = Path(config.run_dir).parent / "lake" / config.spec.sink.path
    figures["read_back"] = spark.read.parquet(str(base)).count()
    return figures


def plain_query(spark, config: RunConfig, out: Path, *, partition_by=(), trigger=None):
    """Spark's own Parquet file sink on the parsed columns the pipeline writes."""
    from pyspark.sql import functions as F

    from jobs.source import PARSED
    from jobs.spec.ddl import parse_schema

    columns = [f.name for f in parse_schema(config.spec.source.schema).fields]
    frame = parsed_frame(source_frame(spark, config), config.spec).select(
        *[F.col(PARSED)[c].alias(c) for c in columns]
    )
    writer = (
        frame.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(out.parent / "plain-checkpoint"))
    )
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if trigger is None:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger} seconds").start()


def files_plain(spark, config: RunConfig) -> dict:
    out = Path(config.run_dir).parent / "plain"
    figures = timed_drain(plain_query(spark, config, out))
    figures["read_back"] = spark.read.parquet(str(out)).count()
    return figures


def visible_files(base: Path) -> list[Path]:
    """The data files a reader of `base` sees (hidden names and Spark's _spark_metadata out)."""
    return [
        p
        for p in base.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(base).parts)
    ]


def file_figures(paths: list[Path]) -> dict:
    sizes = sorted(p.stat().st_size for p in paths)
    per_partition: dict[str, int] = {}
    for p in paths:
        per_partition[p.parent.name] = per_partition.get(p.parent.name, 0) + 1
    return {
        "files": len(sizes),
        "median_bytes": round(statistics.median(sizes)) if sizes else 0,
        "min_bytes": sizes[0] if sizes else 0,
        "max_bytes": sizes[-1] if sizes else 0,
        "files_per_partition": dict(sorted(per_partition.items())),
    }


def files_over_time(spark, bootstrap: str, args) -> dict:
    """Both file paths side by side at a 1 s trigger for `args.minutes`, fed at args.rate."""
    import subprocess

    from jobs.loadgen import ensure_topic

    topic = f"bench-files-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, args.partitions)
    count = int(args.rate * args.minutes * 60)
    producer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobs.loadgen",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--rate",
            str(args.rate),
            "--count",
            str(count),
            "--malformed",
            "0",
            "--partitions",
            str(args.partitions),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    with tempfile.TemporaryDirectory(prefix="bench-files-") as work:
        workdir = Path(work)
        config = files_config(
            topic,
            workdir,
            args.rate * 10,
            target_mb=args.target_mb,
            partition_by=("status",),
            trigger_seconds=1,
            bootstrap=bootstrap,
        )
        ours = start_query(spark, config)
        plain = plain_query(spark, config, workdir / "plain", partition_by=("status",), trigger=1)
        started = time.monotonic()
        try:
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(5)
                for q in (ours, plain):
                    if q.exception():
                        raise q.exception()
        finally:
            try:
                producer.wait(timeout=60)
            except subprocess.TimeoutExpired:
                producer.terminate()  # behind its rate: what it sent is counted below
                producer.wait(timeout=30)
            for q in (ours, plain):
                if q.isActive:
                    q.processAllAvailable()
                    q.stop()
        elapsed = time.monotonic() - started
        count = sum(end_offsets(bootstrap, topic).values())  # what the producer sent
        base = workdir / "lake" / "rolling"
        entries = [json.loads(p.read_text()) for p in (base / "_cp_manifest").glob("*.json")]
        staged = rolling_sink(spark, config).pending()
        rolling = {
            **file_figures(visible_files(base)),
            "rows_finished": sum(e["rows"] for e in entries),
            "staged_bytes": sum(s.bytes for files in staged.values() for s in files),
            "staged_files": sum(len(files) for files in staged.values()),
            "rolls_by_reason": dict(collections.Counter(e["reason"] for e in entries)),
        }
        rolling["rows_staged"] = count - rolling["rows_finished"]
        plain_files = visible_files(workdir / "plain")
        plain_figures = {
            **file_figures(plain_files),
            "rows": spark.read.parquet(str(workdir / "plain")).count(),
        }
    return {
        "minutes": args.minutes,
        "seconds": round(elapsed),
        "rate": args.rate,
        "events": count,
        "target_mb": args.target_mb,
        "partition_by": ["status"],
        "files_rolling": rolling,
        "files_plain": plain_figures,
    }


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {tp.partition: n for tp, n in consumer.end_offsets(partitions).items()}
    finally:
        consumer.close()


def drain_rounds(spark, args, topic: str, bootstrap: str, paths, run) -> dict[str, list[float]]:
    """Each path drains the topic `args.rounds` times (after a warm-up round), alternating
    which goes first; `run(path, workdir)` -> figures."""
    rates: dict[str, list[float]] = {p: [] for p in paths}
    for round_number in range(args.rounds + 1):
        order = paths if round_number % 2 == 0 else paths[::-1]
        for path in order:
            with tempfile.TemporaryDirectory(prefix="bench-sinks-") as work:
                figures = run(path, Path(work))
            rate = figures["rows"] / figures["seconds"]
            warm = " (warm-up, not counted)" if round_number == 0 else ""
            print(
                f"round {round_number} {path}: {figures['rows']:,} rows in"
                f" {figures['seconds']:.2f} s, {rate:,.0f} rows/s{warm}",
                flush=True,
            )
            if figures["rows"] != args.events or figures.get("read_back", args.events) != (
                args.events
            ):
                raise SystemExit(f"{path}: {figures}, not {args.events} rows")
            if round_number:
                rates[path].append(rate)
    return rates


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--per-batch", type=int, default=250_000, help="max_records_per_batch")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=10, help="files at a 1 s trigger")
    parser.add_argument("--rate", type=int, default=8_000, help="events/s meanwhile")
    parser.add_argument("--target-mb", type=int, default=4, help="files_rolling's target")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "sinks.json"))
    parser.add_argument(
        "--parts",
        default="kafka,files,cassandra",
        help="which halves to run (the others' figures are kept from the last run's file)",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jvm.build()

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    created = []
    if {"kafka", "files"} & parts:
        started = time.perf_counter()
        produce(bootstrap, topic, rate=0, count=args.events, partitions=args.partitions)
        print(f"produced {args.events:,} events in {time.perf_counter() - started:.1f} s")
        created.append(topic)
    dead = create_topic(bootstrap, 1)
    created.append(dead)

    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = bench_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    read_back: list[int] = []

    def kafka_path(path: str, work: Path) -> dict:
        out = create_topic(bootstrap, args.partitions)
        created.append(out)
        config = config_for(topic, out, dead, bootstrap, work, args.per_batch)
        if path == "kafka_at_least_once":
            return at_least_once(spark, config, bootstrap)
        figures = exactly_once(spark, config)
        read_back.append(read_committed_count(bootstrap, out))
        return figures

    def file_path(path: str, work: Path) -> dict:
        config = files_config(
            topic, work, args.per_batch, target_mb=args.target_mb, bootstrap=bootstrap
        )
        return (
            files_rolling(spark, config) if path == "files_rolling" else files_plain(spark, config)
        )

    previous = {}
    if parts != {"kafka", "files", "cassandra"} and Path(args.output).exists():
        previous = json.loads(Path(args.output).read_text().splitlines()[-1])
    cassandra = previous.get("cassandra")
    try:
        if "cassandra" in parts:
            cassandra = {"machine": machine(), **cassandra_sink.run_part(spark, args, bootstrap)}
        if "kafka" in parts or "files" in parts:
            rates = drain_rounds(spark, args, topic, bootstrap, PATHS, kafka_path)
            read_back = read_back[1:]  # the warm-up round's is not reported
            rates.update(drain_rounds(spark, args, topic, bootstrap, FILE_PATHS, file_path))
            over_time = files_over_time(spark, bootstrap, args)
    finally:
        spark.stop()
        delete_topics(bootstrap, created)
    if cassandra is not None:
        print()
        print(f"{'path':<22}{'rows/s (median)':>18}   p50/p95/p99 ms   Cassandra CPU (cores)")
        for path in cassandra_sink.PATHS:
            p50, p95, p99 = cassandra["latency_ms_p50_p95_p99"][path]
            print(
                f"{path:<22}{cassandra['events_per_s'][path]:>18,}   {p50}/{p95}/{p99}"
                f"   {cassandra['cassandra_cpu_cores'][path]}"
            )
        print(
            f"cassandra_sink_to_ceiling: {cassandra['ratio_sink_to_ceiling']}x (target >="
            f" {cassandra_sink.TARGET}x: {'met' if cassandra['met'] else 'NOT met'})"
        )
    if not ({"kafka", "files"} & parts):
        result = {**previous, "cassandra": cassandra}
        line = json.dumps(result)
        Path(args.output).write_text(line + "\n")
        print(line)
        return 0 if cassandra["met"] else 1

    medians = {p: round(statistics.median(v)) for p, v in rates.items()}
    ratios = {
        "kafka_exactly_once_to_at_least_once": round(
            medians["kafka_exactly_once"] / medians["kafka_at_least_once"], 3
        ),
        "files_rolling_to_plain": round(medians["files_rolling"] / medians["files_plain"], 3),
    }
    size_ratio = round(
        over_time["files_rolling"]["median_bytes"] / (args.target_mb * 1024 * 1024), 3
    )
    met = {name: ratios[name] >= target for name, target in TARGETS.items()}
    met["files_rolling_median_size_within_20_percent"] = (
        FILE_SIZE_BAND[0] <= size_ratio <= FILE_SIZE_BAND[1]
    )
    print()
    print(f"{'path':<22}{'rows/s (median)':>18}   rounds")
    for path in (*PATHS, *FILE_PATHS):
        print(f"{path:<22}{medians[path]:>18,}   {', '.join(f'{r:,.0f}' for r in rates[path])}")
    for name, target in TARGETS.items():
        print(f"{name}: {ratios[name]}x (target >= {target}x: {'met' if met[name] else 'NOT met'})")
    print(f"read back with read_committed (each round's exactly-once output): {read_back}")
    print(
        f"after {over_time['seconds']} s at a 1 s trigger, {args.rate:,} events/s, partitioned"
        " by status:"
    )
    for path in FILE_PATHS:
        f = over_time[path]
        print(
            f"  {path:<14} {f['files']:>6,} files, median {f['median_bytes'] / 1e6:8.3f} MB"
            f" (min {f['min_bytes'] / 1e6:.3f}, max {f['max_bytes'] / 1e6:.3f}),"
            f" per partition {f['files_per_partition']}"
        )
    rolling = over_time["files_rolling"]
    print(
        f"  files_rolling: {rolling['rows_finished']:,} rows finished,"
        f" {rolling['rows_staged']:,} staged ({rolling['staged_bytes'] / 1e6:.1f} MB, waiting"
        f" for the target); median file / target {size_ratio}x (band {FILE_SIZE_BAND}:"
        f" {'met' if met['files_rolling_median_size_within_20_percent'] else 'NOT met'})"
    )
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
        "files_over_time": over_time,
        "files_rolling_median_size_to_target": size_ratio,
        "file_size_band": FILE_SIZE_BAND,
        "met": met,
        "exactly_once_read_back": read_back,
        "exactly_once_read_back_ok": all(n == args.events for n in read_back),
        "cassandra": cassandra,
    }
    line = json.dumps(result)
    Path(args.output).write_text(line + "\n")
    print(line)
    return 0 if all(met.values()) and result["exactly_once_read_back_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
