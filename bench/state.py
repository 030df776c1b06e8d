"""Large state: an exact distinct count over 100-byte random strings, with Spark's default
state store and with RocksDB, side by side in one run (the seed's experiment).

    .venv/bin/python bench/state.py [--minutes 10 --rate 5000 --partitions 2
                                     --driver-memory 2g]   (after ./stack services)

A producer (a separate process) sends --rate records per second for --minutes into a fresh
topic: `{"s": <100 random characters>, "ts": <now>}`, every string new. Two pipelines read it
at a 1 s trigger, side by side, each the real job (jobs.pipeline.start_query) in a Spark
application of its own (local[2], a --driver-memory heap each: the same memory for both,
and one store's garbage collection never pauses the other):

  hdfs      state_store "hdfs": Spark's default, every key in the executors' memory, each
            batch's changes written as a delta file, snapshots made in the background
  rocksdb   state_store "rocksdb": RocksDB on local disk, changelog checkpointing

Both run the same spec: `source.deduplicate` by `s` within a one-day watermark on `ts` (so
nothing is evicted during the run: every string seen stays in state, which is what an exact
distinct count has to keep), then `SELECT s, ts FROM source WHERE s LIKE 'AA%'` into a
Postgres table (a 4096th of the strings: the sink costs next to nothing). The state's rows
are the distinct count.

From each batch's progress (StreamingQueryProgress.stateOperators): the state store's
commit duration (commitTimeMs), the batch's duration, its rows, the state's rows, memory and
size (RocksDB's SST files; the default store's current version in memory), and the
checkpoint's state directory on disk each minute (each batch reads its offsets twice,
jobs.pipeline.source_reads: rows are counted once). A store whose application fails (out of
memory) is reported with what was measured up to then, and when it failed. Per minute: the
median commit duration and batch duration, throughput (rows / the batches' durations), rows
processed, and the state at the minute's end.

Target: RocksDB's commit duration stays flat, its last minute's median <= 2x its first
minute's, printed next to the default store's same ratio (the baseline, measured in the same
run). The last line is one JSON object with every figure (and both stores' series, a point
per batch, for the dashboard's state charts), also written to bench/results/state.json.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import bench_config, bench_session, delete_topics, machine  # noqa: E402
from jobs import jvm  # noqa: E402
from jobs.checkpoints import tree_size  # noqa: E402
from jobs.pipeline import start_query  # noqa: E402
from jobs.reporting import per_read  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402
from jobs.stateful import source_reads  # noqa: E402

STORES = ("hdfs", "rocksdb")
CURRENT_VERSION_SIZE = "stateOnCurrentVersionSizeBytes"  # the default store's, in memory
TARGET_COMMIT_GROWTH = 2.0  # RocksDB: last minute's median commit <= 2x the first's


def produce(bootstrap: str, topic: str, rate: float, seconds: float, partitions: int) -> int:
    """Send `rate` new random strings per second for `seconds` (run in its own process)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    started, sent = time.monotonic(), 0
    try:
        while (elapsed := time.monotonic() - started) < seconds:
            due = int(elapsed * rate) + 1
            now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
            while sent < due:
                s = base64.b64encode(os.urandom(75)).decode()  # 100 characters
                value = json.dumps({"s": s, "ts": now}).encode()
                producer.send(topic, value=value, partition=sent % partitions)
                sent += 1
            time.sleep(0.01)
        producer.flush()
    finally:
        producer.close()
    return sent


def spec_for(topic: str, table: str, store: str, rate: int, partitions: int) -> dict:
    return {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": "s STRING, ts TIMESTAMP",
            "starting_offsets": "earliest",
            "max_records_per_batch": rate * 10,
            "min_partitions": partitions,
            "watermark": {"column": "ts", "delay_seconds": 86400},
            "deduplicate": {"key": ["s"]},
        },
        "transform": {"sql": "SELECT s, ts FROM source WHERE s LIKE 'AA%'"},
        "sink": {"connection": "pg", "table": table},
        "trigger": {"interval_seconds": 1},
        "state_store": store,
    }


# How many times each batch of the bench's (stateful) spec reads its source.
STATEFUL_READS = source_reads(parse_spec(spec_for("t", "t", "rocksdb", 1, 1)))


def sample(progress: dict, started: float) -> dict | None:
    """One batch's figures, from its progress (None for a batch without stateful work)."""
    operators = progress.get("stateOperators") or []
    if not operators:
        return None
    op = operators[0]
    custom = op.get("customMetrics") or {}
    at = datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
    return {
        "t": round(at - started, 1),
        "batch": progress["batchId"],
        # Each batch reads its offsets twice (jobs.pipeline.source_reads): records, not reads.
        "rows_in": per_read(progress, STATEFUL_READS)["numInputRows"],
        "batch_ms": progress["durationMs"].get("triggerExecution", 0),
        "commit_ms": op.get("commitTimeMs", 0),
        "state_rows": op.get("numRowsTotal", 0),
        "memory_bytes": op.get("memoryUsedBytes", 0),
        # RocksDB's live SST files; the default store's current version (in memory).
        "size_bytes": custom.get(
            "rocksdbSstFileSize", custom.get("stateOnCurrentVersionSizeBytes")
        ),
        "checkpoint_ms": custom.get("rocksdbCommitCheckpointLatency"),
    }


def per_minute(samples: list[dict], disk: list[tuple[float, int]], minutes: int) -> list[dict]:
    out = []
    for m in range(minutes):
        mine = [s for s in samples if m * 60 <= s["t"] < (m + 1) * 60]
        if not mine:
            continue
        busy = sum(s["batch_ms"] for s in mine) / 1000
        on_disk = [b for t, b in disk if t <= (m + 1) * 60 + 5]
        out.append(
            {
                "minute": m + 1,
                "batches": len(mine),
                "rows": sum(s["rows_in"] for s in mine),
                "rows_per_second": round(sum(s["rows_in"] for s in mine) / busy) if busy else 0,
                "median_commit_ms": statistics.median(s["commit_ms"] for s in mine),
                "max_commit_ms": max(s["commit_ms"] for s in mine),
                "median_batch_ms": statistics.median(s["batch_ms"] for s in mine),
                "state_rows": mine[-1]["state_rows"],
                "memory_mb": round(mine[-1]["memory_bytes"] / 2**20, 1),
                "size_mb": round((mine[-1]["size_bytes"] or 0) / 2**20, 1),
                "checkpoint_state_mb": round(on_disk[-1] / 2**20, 1) if on_disk else None,
            }
        )
    return out


def growth(minutes: list[dict]) -> float | None:
    """The last minute's median commit duration / the first's (a full minute each)."""
    if len(minutes) < 2:
        return None
    first, last = minutes[0]["median_commit_ms"], minutes[-1]["median_commit_ms"]
    return round(last / max(first, 1), 2)


def worker(args, bootstrap: str) -> int:
    """One store's pipeline in a Spark application of its own, for args.seconds: its
    samples and the checkpoint's state size on disk written to args.samples as it goes
    (whatever happens to the JVM, what was measured is kept)."""
    store, topic = args.worker
    sink_dsn = os.environ["CONTROLPLANE_SINK_DATABASE_URL"]
    started = float(args.started)
    found: dict[int, dict] = {}
    disk: list[tuple[float, int]] = []
    record = {"store": store, "samples": [], "disk": [], "error": None}

    def save() -> None:
        record["samples"] = sorted(found.values(), key=lambda s: s["t"])
        record["disk"] = disk
        Path(args.samples).write_text(json.dumps(record))

    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = bench_session(args.master, {"spark.driver.memory": args.driver_memory})
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory(prefix=f"bench-state-{store}-") as work:
        spec = spec_for(topic, f"bench_state_{store}", store, args.rate, args.partitions)
        config = bench_config(
            spec, Path(work), bootstrap, f"state-{store}", postgres={"conninfo": sink_dsn}
        )
        next_disk = 0.0
        try:
            query = start_query(spark, config)
            while (elapsed := time.time() - started) < args.minutes * 60 + 5:
                time.sleep(2)
                if query.exception():
                    raise query.exception()
                for p in query.recentProgress:
                    sampled = sample(json.loads(p.json), started)
                    if sampled and sampled["batch"] not in found:
                        found[sampled["batch"]] = sampled
                if elapsed >= next_disk:
                    disk.append((elapsed, tree_size(Path(config.checkpoint) / "state")[0]))
                    next_disk += 60
                    save()
            query.stop()
        except Exception as exc:  # the JVM out of memory, a failed batch: measured up to it
            record["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            record["error_at_seconds"] = round(time.time() - started)
        finally:
            save()
            spark.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--rate", type=int, default=5_000, help="new strings per second")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--driver-memory", default="2g", help="each store's JVM heap")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "state.json"))
    parser.add_argument("--produce", nargs=3, metavar=("TOPIC", "RATE", "SECONDS"))
    parser.add_argument("--worker", nargs=2, metavar=("STORE", "TOPIC"))
    parser.add_argument("--samples")
    parser.add_argument("--started")
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    if args.produce:  # the producer process
        topic, rate, seconds = args.produce
        produce(bootstrap, topic, float(rate), float(seconds), args.partitions)
        return 0
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.worker:  # one store's Spark application
        return worker(args, bootstrap)
    jvm.build()
    from jobs.loadgen import ensure_topic

    topic = f"bench-state-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, args.partitions)
    seconds = args.minutes * 60
    common = [
        *("--minutes", str(args.minutes), "--rate", str(args.rate)),
        *("--partitions", str(args.partitions), "--driver-memory", args.driver_memory),
        *("--master", args.master),
    ]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-state-") as work:
        started = time.time() + 45  # the applications start meanwhile; then the producer
        workers = {
            store: subprocess.Popen(
                [
                    *(sys.executable, __file__, *common, "--worker", store, topic),
                    *("--samples", str(Path(work) / f"{store}.json"), "--started", str(started)),
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=open(Path(work) / f"{store}.log", "w"),  # noqa: SIM115 - the child's
            )
            for store in STORES
        }
        time.sleep(max(0.0, started - time.time()))
        producer = subprocess.Popen(
            [
                *(sys.executable, __file__, "--partitions", str(args.partitions)),
                *("--produce", topic, str(args.rate), str(seconds)),
            ],
            cwd=ROOT,
        )
        while any(w.poll() is None for w in workers.values()):
            time.sleep(10)
            done = {}
            for store in STORES:
                path = Path(work) / f"{store}.json"
                done[store] = len(json.loads(path.read_text())["samples"]) if path.exists() else 0
            print(f"{time.time() - started:6.0f} s: batches {done}", flush=True)
        producer.wait(timeout=120)
        delete_topics(bootstrap, [topic])
        for store in STORES:
            path = Path(work) / f"{store}.json"
            results[store] = json.loads(path.read_text()) if path.exists() else {}
            if not results[store].get("samples"):
                print((Path(work) / f"{store}.log").read_text()[-3000:])
    summary_stores = {}
    for store in STORES:
        series = results[store].get("samples") or []
        disk = [tuple(d) for d in results[store].get("disk") or []]
        minutes = per_minute(series, disk, args.minutes)
        summary_stores[store] = {
            "per_minute": minutes,
            "commit_last_to_first_minute": growth(minutes),
            "distinct_count": series[-1]["state_rows"] if series else 0,
            "error": results[store].get("error"),
            "error_at_seconds": results[store].get("error_at_seconds"),
            "series": [
                [s["t"], s["commit_ms"], s["batch_ms"], s["state_rows"], s["size_bytes"]]
                for s in series
            ],
        }
        print(
            f"\n{store}:"
            + (
                f" FAILED at {results[store].get('error_at_seconds')} s: {results[store]['error']}"
                if results[store].get("error")
                else ""
            )
        )
        for m in minutes:
            print(
                f"  minute {m['minute']:2}: commit median {m['median_commit_ms']:6} ms"
                f" (max {m['max_commit_ms']}), batch median {m['median_batch_ms']:6} ms,"
                f" {m['rows_per_second']:>7,} rows/s, state {m['state_rows']:>10,} rows,"
                f" {m['memory_mb']} MB memory, {m['size_mb']} MB size,"
                f" checkpoint {m['checkpoint_state_mb']} MB"
            )
    rocks, hdfs = (summary_stores[s]["commit_last_to_first_minute"] for s in ("rocksdb", "hdfs"))
    met = rocks is not None and rocks <= TARGET_COMMIT_GROWTH
    print(
        f"\ncommit duration, last minute / first: rocksdb {rocks}x (target <= "
        f"{TARGET_COMMIT_GROWTH}x: {'met' if met else 'NOT met'}), hdfs (baseline) {hdfs}x"
    )
    summary = {
        "bench": "state",
        "machine": machine(),
        "minutes": args.minutes,
        "rate": args.rate,
        "partitions": args.partitions,
        "driver_memory": args.driver_memory,
        "commit_last_to_first_minute": {"rocksdb": rocks, "hdfs_baseline": hdfs},
        "target": {"rocksdb_commit_last_to_first_at_most": TARGET_COMMIT_GROWTH, "met": met},
        "stores": summary_stores,
        "series_columns": ["t_seconds", "commit_ms", "batch_ms", "state_rows", "size_bytes"],
    }
    line = json.dumps(summary)
    Path(args.output).write_text(line + "\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
