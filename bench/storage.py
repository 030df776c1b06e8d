"""Checkpoints, the files sink and restore points on the local disk, HDFS and S3, side by side
in one run (issue #32).

    .venv/bin/python bench/storage.py [--rounds 4 --batches 10 --events 1000000 --minutes 2
                                       --state-mb 1024 --restore-rounds 2]
        (after: eval "$(./stack services)", with HDFS and the S3 server up and their
         CONTROLPLANE_HDFS_* / CONTROLPLANE_S3_* exported, as `./stack test` does)

One Spark application (local[2]) configured as a driver is (jobs.hadoop.session_conf: the
S3A and HDFS client settings, S3A's jars from jobs.jvm.spark_jars()), one session per store
with the checkpoint manager a driver with that checkpoint root gets (Spark's FileSystem-based
one on the local disk and HDFS, ours without renames on S3). Rounds interleave the stores, in
an order that turns by one each round: this 2-core machine's speed drifts within minutes, so
each store's figure is compared with the local disk's taken seconds apart.

1. Checkpoint overhead of a small pipeline. The real pipeline (jobs.pipeline.start_query,
   availableNow): Kafka delivery events, 200 records a batch, a per-minute count per courier
   (`GROUP BY window(event_time, '1 minute'), courier_id`, update mode, RocksDB state with
   changelog checkpointing, 2 state partitions) upserted into Postgres (the same sink cost on
   every store). Each store keeps one checkpoint for the whole run; each round produces
   --batches x 200 new records and runs each store's query over them, so each round after
   the first is a restart on the same checkpoint. From the batches' progress: walCommit and
   commitOffsets (durationMs: the write-ahead and commit log entries) and the state commit
   (stateOperators commitTimeMs, summed over the batch's 2 state stores, which commit in
   parallel tasks), p50/p95 over every batch but each run's first; and restart-to-first-
   commit: from start_query() to the end of the first batch (its progress timestamp plus its
   triggerExecution), which includes the driver's own reads of the checkpoint through
   jobs.storage (the reader's pin, the state store it started with) and the state's load
   (the state store maintenance interval is 5 s here, not 60: a stopped query's state stores
   are unloaded before it starts again, so a restart reads its state back from the store, as
   a new driver does). Beside it, per store: one small file created, written and closed
   through Hadoop's FileSystem, and renamed (what the FileSystem-based manager does per log
   entry; on S3 a rename is a copy and a delete, which our manager avoids).
2. The files sink on HDFS against Spark's own file sink (format parquet) on HDFS, the same
   parsed columns of the same topic (--events, 250,000 a batch), checkpoints on HDFS too:
   throughput, rows / the batches' durations, ours with the rolls done meanwhile and the
   final roll of what is left (every row in a finished file); rounds alternate which goes
   first, medians reported; every round's output read back and counted. Goal: ours >= 0.8x
   Spark's. Then --minutes at a 1 s trigger, --rate events/s, both side by side partitioned
   by status, ours rolling to a --target-mb target: the finished files' sizes against the
   target (goal: the median within 10 %) and Spark's file count and median size (one file per
   task and partition per batch: the seed's small-files problem).
3. Restore points of a large RocksDB state. The state is built once by Spark on the local
   disk (a streaming aggregation, RocksDB with changelog checkpointing, of 64-character keys
   each with a random 1,024-character value, made from a small Kafka topic: a checkpoint
   whose offsets are a Kafka source's, as the control plane reads them) until its state
   holds --state-mb or --state-seconds have passed (building 1 GiB through Spark takes about
   2-3 minutes here; no snapshot is uploaded meanwhile, so the checkpoint holds the state's
   changelogs: a long-running query's would also hold a snapshot's SST files, about as many
   bytes again, which a restore point copies too), then copied file for file (Hadoop's
   FileUtil.copy) to where the control plane keeps that pipeline's checkpoint on HDFS and on
   S3. Then, in a database of its own, the control plane's own code:
   controlplane.supervision.restore_points.take (local: hard-linked copy; HDFS: a snapshot;
   S3: server-side copies; each cut back to the last committed batch) and restore (the
   point's files copied back, cut back, a new query id, the current checkpoint set aside, the
   copy moved into place), with the checkpoint root switched from store to store between
   calls, rounds interleaved.

Other sessions' fault tests stop and start HDFS and the S3 server on this machine: a thread
watches their ports and the run records any outage (`services_down`) and any restart of their
processes (`services_restarted`); figures taken across one are not to be trusted.

The last line is one JSON object with every figure and the machine, also written to
bench/results/storage.json. Everything the run wrote (topics, tables, HDFS and S3 prefixes,
snapshots, the database) is removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.throughput import (  # noqa: E402
    bench_session,
    bench_source,
    delete_topics,
    drop_tables,
    files_spec,
    machine,
    timed_drain,
)
from jobs import checkpoints as checkpoint_files  # noqa: E402
from jobs import hadoop, jvm  # noqa: E402
from jobs import loadgen as loadgen_module  # noqa: E402
from jobs.batch import stream_id  # noqa: E402
from jobs.checkpoints import tree_size  # noqa: E402
from jobs.pipeline import start_query  # noqa: E402
from jobs.runconfig import RunConfig  # noqa: E402
from jobs.source import PARSED, parsed_frame, source_frame  # noqa: E402
from jobs.spec import parse_spec  # noqa: E402
from jobs.stateful import CHANGELOG_CONF, STATE_STORE_CONF, STATE_STORE_PROVIDERS  # noqa: E402
from jobs.storage import StorageSettings, join, parent, storage_for  # noqa: E402

STORES = ("local", "hdfs", "s3a")
FILES_TARGET = 0.8  # ours / Spark's file sink throughput on HDFS
SIZE_BAND = 0.10  # finished files' median within 10 % of the target
ROWS_PER_BATCH = 200
MAINTENANCE = "spark.sql.streaming.stateStore.maintenanceInterval"
WINDOW_SQL = (
    "SELECT window.start AS minute, courier_id, count(*) AS n FROM source"
    " GROUP BY window(event_time, '1 minute'), courier_id"
)
SCHEMA = (
    "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE, lon DOUBLE,"
    " event_time TIMESTAMP"
)
NAMENODE_KEYS = (
    "dfs.namenode.file.close.num-committed-allowed",
    "dfs.replication",
    "dfs.client.block.write.locateFollowingBlock.initial.delay.ms",
)


# -- where, and how to reach it ------------------------------------------------------------


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        raise SystemExit(
            f"{name} is not set: start HDFS and the S3 server (./stack test starts them) and"
            " export their addresses (CONTROLPLANE_HDFS_URL, CONTROLPLANE_HDFS_HTTP_ADDRESS,"
            " CONTROLPLANE_S3_ENDPOINT, CONTROLPLANE_S3_ACCESS_KEY, CONTROLPLANE_S3_SECRET_KEY)"
        )
    return value


def settings_for(kind: str) -> StorageSettings:
    """The control plane's settings for a checkpoint root on `kind`."""
    if kind == "hdfs":
        return StorageSettings(
            hdfs_http=env("CONTROLPLANE_HDFS_HTTP_ADDRESS"),
            hdfs_user=os.environ.get("CONTROLPLANE_HDFS_USER") or None,
        )
    if kind == "s3a":
        return StorageSettings(
            s3_endpoint=env("CONTROLPLANE_S3_ENDPOINT"),
            s3_access_key=env("CONTROLPLANE_S3_ACCESS_KEY"),
            s3_secret_key=env("CONTROLPLANE_S3_SECRET_KEY"),
        )
    return StorageSettings()


def bench_roots(unique: str, local: Path) -> dict[str, str]:
    """The run's own root on each store."""
    bucket = os.environ.get("CONTROLPLANE_S3_BUCKET") or "controlplane"
    return {
        "local": str(local),
        "hdfs": join(env("CONTROLPLANE_HDFS_URL"), "bench", unique),
        "s3a": f"s3a://{bucket}/bench/{unique}",
    }


def driver_storage(kind: str, root: str) -> dict:
    """What a driver is given for a checkpoint root on `kind` (run.json's "storage")."""
    return settings_for(kind).for_driver(root)


def everything_storage() -> dict:
    """HDFS and S3 at once: the Hadoop client settings of the one Spark application."""
    return {
        **settings_for("s3a").for_driver("s3a://b/x"),
        "hdfs": settings_for("hdfs").for_driver("hdfs://x/x")["hdfs"],
    }


def session_for(spark, kind: str, root: str):
    """A session whose checkpoints are written by the manager a driver with `root` gets."""
    session = spark.newSession()
    conf = hadoop.session_conf(driver_storage(kind, root))
    session.conf.set(hadoop.CHECKPOINT_MANAGER, conf[hadoop.CHECKPOINT_MANAGER])
    return session


def namenode_conf() -> dict:
    """The running NameNode's settings that change the HDFS figures (its /conf page)."""
    address = env("CONTROLPLANE_HDFS_HTTP_ADDRESS")
    try:
        with urllib.request.urlopen(f"http://{address}/conf", timeout=10) as response:
            text = response.read().decode()
    except OSError as exc:
        return {"error": str(exc)}
    found = {}
    for key in NAMENODE_KEYS:
        match = re.search(
            rf"<name>{re.escape(key)}</name><value>([^<]*)</value>.*?<source>([^<]*)</source>",
            text,
        )
        found[key] = {"value": match.group(1), "source": match.group(2)} if match else None
    return found


SERVICE_PIDS = {
    "namenode": ROOT / "var" / "hdfs" / "namenode.pid",
    "datanode": ROOT / "var" / "hdfs" / "datanode.pid",
    "s3proxy": ROOT / "var" / "s3" / "s3proxy.pid",
}


def service_pids() -> dict[str, int | None]:
    """The dev stack's HDFS and S3 processes (another session's fault test may restart them:
    the figures of a run during which one changed are not to be trusted)."""
    found = {}
    for name, path in SERVICE_PIDS.items():
        try:
            found[name] = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            found[name] = None
    return found


class Outages:
    """Watches the HDFS NameNode's and DataNode's and the S3 server's ports every 2 s in a
    thread: a store stopped or restarted meanwhile (by another session's fault test) is
    recorded, with when, so the figures it touched are not taken at face value."""

    def __init__(self):
        import threading

        hdfs = urlsplit(env("CONTROLPLANE_HDFS_URL"))
        s3 = urlsplit(env("CONTROLPLANE_S3_ENDPOINT"))
        self.ports = {
            "namenode": (hdfs.hostname, hdfs.port),
            "s3": (s3.hostname, s3.port),
        }
        self.down: list[str] = []
        self.started = time.monotonic()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import socket

        while not self.stopped.wait(2):
            for name, address in self.ports.items():
                try:
                    socket.create_connection(address, timeout=2).close()
                except OSError:
                    at = round(time.monotonic() - self.started)
                    self.down.append(f"{name} refused connections at {at} s")
                    print(f"WARNING: {self.down[-1]}", flush=True)

    def stop(self) -> list[str]:
        self.stopped.set()
        return self.down


def wait_for_services(timeout: float = 300) -> None:
    """Until HDFS (out of safe mode, WebHDFS answering) and the S3 server answer."""
    hdfs = settings_for("hdfs")
    s3 = settings_for("s3a")
    deadline = time.monotonic() + timeout
    while True:
        problems = []
        try:
            store = storage_for("hdfs://x/", hdfs)
            store.makedirs(join(env("CONTROLPLANE_HDFS_URL"), "bench"))
        except OSError as exc:
            problems.append(f"HDFS: {exc}")
        try:
            storage_for("s3a://x/", s3).exists(
                f"s3a://{os.environ.get('CONTROLPLANE_S3_BUCKET') or 'controlplane'}/bench"
            )
        except OSError as exc:
            problems.append(f"S3: {exc}")
        if not problems:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the stores do not answer: {problems}")
        print(f"waiting for the stores: {problems}", flush=True)
        time.sleep(5)


# -- small helpers -------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values: list[float], digits: int = 1) -> dict:
    return {
        "p50": round(statistics.median(values), digits) if values else None,
        "p95": round(percentile(values, 0.95), digits) if values else None,
        "n": len(values),
    }


def ratio(a, b, digits: int = 2):
    return round(a / b, digits) if a is not None and b else None


def turn(items: tuple[str, ...], by: int) -> tuple[str, ...]:
    by %= len(items)
    return items[by:] + items[:by]


def produce(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    """jobs.loadgen.produce, its signal handlers put back afterwards (it installs its own)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        loadgen_module.produce(bootstrap, topic, rate=0, count=count, partitions=partitions)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


# -- 1. checkpoint overhead ----------------------------------------------------------------


def overhead_config(topic, kind, root, bootstrap, sink_dsn, work: Path, suffix) -> RunConfig:
    spec = {
        "source": {
            **bench_source(topic, ROWS_PER_BATCH),
            "watermark": {"column": "event_time", "delay_seconds": 600},
        },
        "transform": {"sql": WINDOW_SQL, "output_mode": "update"},
        "sink": {
            "connection": "pg",
            "table": f"storage_{kind}_{suffix}",
            "mode": "upsert",
            "key": ["minute", "courier_id"],
        },
        "state_store": "rocksdb",
    }
    run_dir = work / kind / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"storage-{kind}-{suffix}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=join(root, "overhead", "checkpoint"),
        run_dir=str(run_dir),
        storage=None if kind == "local" else driver_storage(kind, root),
    )


def file_ops(spark, base: str, n: int) -> dict[str, list[float]]:
    """ms, n times, through Hadoop's FileSystem: to create a file (the NameNode's create),
    to write 200 bytes into it and close it (a block from the NameNode, the DataNode's
    pipeline, the NameNode's complete; on S3 the PUT), and to rename it."""
    jvm_ = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    path = jvm_.org.apache.hadoop.fs.Path
    fs = path(base).getFileSystem(conf)
    data = bytearray(b"x" * 200)
    got: dict[str, list[float]] = {"create": [], "write_close": [], "rename": []}
    for i in range(n):
        name = f"{base}/{uuid.uuid4().hex[:8]}-{i}"
        started = time.perf_counter()
        out = fs.create(path(name + ".tmp"), True)
        created = time.perf_counter()
        out.write(data)
        out.close()
        closed = time.perf_counter()
        fs.rename(path(name + ".tmp"), path(name))
        got["create"].append((created - started) * 1000)
        got["write_close"].append((closed - created) * 1000)
        got["rename"].append((time.perf_counter() - closed) * 1000)
    fs.delete(path(base), True)
    return got


def checkpoint_overhead(spark, args, roots, bootstrap, sink_dsn, work: Path, suffix, cleanup):
    topic = f"bench-storage-{suffix}"
    cleanup["topics"].append(topic)
    sessions = {kind: session_for(spark, kind, roots[kind]) for kind in STORES}
    configs = {
        kind: overhead_config(topic, kind, roots[kind], bootstrap, sink_dsn, work, suffix)
        for kind in STORES
    }
    for config in configs.values():
        cleanup["tables"].append(config.spec.sink.table)
        cleanup["pipelines"].append(config.pipeline)
    phases = {k: {"wal_commit": [], "commit_offsets": [], "state_commit": [], "overhead": [],
                  "batch": [], "add_batch": []} for k in STORES}  # fmt: skip
    restarts: dict[str, list[float]] = {k: [] for k in STORES}
    first_start: dict[str, float] = {}
    ops: dict[str, dict[str, list[float]]] = {
        k: {"create": [], "write_close": [], "rename": []} for k in STORES
    }
    for round_ in range(args.rounds + 1):  # round 0: the checkpoints' first start, not counted
        produce(bootstrap, topic, ROWS_PER_BATCH * args.batches, partitions=2)
        for kind in turn(STORES, round_):
            started = time.time()
            query = start_query(sessions[kind], configs[kind], available_now=True)
            query.awaitTermination()
            if query.exception():
                raise query.exception()
            batches = [p for p in query.recentProgress if p["numInputRows"]]
            first = batches[0]
            committed = epoch(first["timestamp"]) + first["durationMs"]["triggerExecution"] / 1000
            start_s = committed - started
            got = phases[kind]
            for p in batches[1:]:
                d = p["durationMs"]
                state = sum(op.get("commitTimeMs", 0) for op in p.get("stateOperators") or [])
                wal, offsets = d.get("walCommit", 0), d.get("commitOffsets", 0)
                if round_:
                    got["wal_commit"].append(wal)
                    got["commit_offsets"].append(offsets)
                    got["state_commit"].append(state)
                    got["overhead"].append(wal + offsets + state)
                    got["batch"].append(d.get("triggerExecution", 0))
                    got["add_batch"].append(d.get("addBatch", 0))
            if round_:
                restarts[kind].append(start_s)
                for op, values in file_ops(
                    spark, join(roots[kind], "file-ops", str(round_)), args.file_ops
                ).items():
                    ops[kind][op] += values
            else:
                first_start[kind] = start_s
            tail = batches[1:]
            print(
                f"round {round_} {kind:>5}: {'restart' if round_ else 'first start'} to first"
                f" commit {start_s:5.2f} s; {len(batches)} batches, walCommit p50"
                f" {statistics.median([p['durationMs'].get('walCommit', 0) for p in tail]):.0f}"
                f" ms, commitOffsets p50"
                f" {statistics.median([p['durationMs'].get('commitOffsets', 0) for p in tail]):.0f}"
                f" ms{' (not counted)' if not round_ else ''}",
                flush=True,
            )
    per_store = {}
    for kind in STORES:
        got = phases[kind]
        per_store[kind] = {
            **{f"{name}_ms": summary(values) for name, values in got.items()},
            "restart_to_first_commit_s": {
                "median": round(statistics.median(restarts[kind]), 2),
                "max": round(max(restarts[kind]), 2),
                "values": [round(v, 2) for v in restarts[kind]],
            },
            "first_start_to_first_commit_s": round(first_start[kind], 2),
            "small_file_ms": {op: summary(values, 2) for op, values in ops[kind].items()},
        }
    local = per_store["local"]
    ratios = {}
    for kind in ("hdfs", "s3a"):
        mine = per_store[kind]
        ratios[kind] = {
            "overhead_p50": ratio(mine["overhead_ms"]["p50"], local["overhead_ms"]["p50"]),
            "overhead_p95": ratio(mine["overhead_ms"]["p95"], local["overhead_ms"]["p95"]),
            "batch_p50": ratio(mine["batch_ms"]["p50"], local["batch_ms"]["p50"]),
            "restart": ratio(
                mine["restart_to_first_commit_s"]["median"],
                local["restart_to_first_commit_s"]["median"],
            ),
        }
    return {
        "rows_per_batch": ROWS_PER_BATCH,
        "batches_per_round": args.batches,
        "rounds": args.rounds,
        "state_partitions": 2,
        "per_store": per_store,
        "to_local": ratios,
    }


def print_overhead(figures: dict) -> None:
    print(
        f"\n1. checkpoint per batch, {figures['rows_per_batch']}-row batches, RocksDB state"
        f" (ms, p50 / p95; x local disk's p50 in the same run)"
    )
    head = ("walCommit", "commitOffsets", "state commit", "sum", "whole batch", "restart s")
    print(f"  {'store':<6}" + "".join(f"{h:>19}" for h in head))
    local = figures["per_store"]["local"]
    for kind, f in figures["per_store"].items():
        cells = []
        for key in ("wal_commit_ms", "commit_offsets_ms", "state_commit_ms", "overhead_ms",
                    "batch_ms"):  # fmt: skip
            x = ratio(f[key]["p50"], local[key]["p50"], 1) if kind != "local" else None
            cells.append(
                f"{f[key]['p50']:.0f} / {f[key]['p95']:.0f}" + (f" x{x}" if x is not None else "")
            )
        restart = f["restart_to_first_commit_s"]["median"]
        x = ratio(restart, local["restart_to_first_commit_s"]["median"], 1)
        cells.append(f"{restart:.2f}" + (f" x{x}" if kind != "local" else ""))
        print(f"  {kind:<6}" + "".join(f"{c:>19}" for c in cells))
    print("  one small file through Hadoop's FileSystem (ms, p50 / p95):")
    for kind, f in figures["per_store"].items():
        print(
            f"    {kind:<6}"
            + ", ".join(
                f"{op} {v['p50']:.1f} / {v['p95']:.1f}" for op, v in f["small_file_ms"].items()
            )
        )


# -- 2. the files sink on HDFS ---------------------------------------------------------------


def files_config(spec: dict, root: str, bootstrap: str, work: Path) -> RunConfig:
    run_dir = work / uuid.uuid4().hex[:8]
    run_dir.mkdir(parents=True)
    return RunConfig(
        pipeline=f"storage-files-{uuid.uuid4().hex[:6]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={},
        checkpoint=join(root, "checkpoint"),
        run_dir=str(run_dir),
        sink_configs=({"files": {"root": join(root, "lake")}},),
        storage=driver_storage("hdfs", root),
    )


def file_sink_of(session, config: RunConfig):
    from jobs.sinks.files import store as files

    base = files.base_uri(config.sink_configs[0]["files"]["root"], config.spec.sink.path)
    query = stream_id(config.checkpoint, config.store)
    return files.FilesStore(session, base, config.spec.sink, query)


def ours(session, config: RunConfig) -> dict:
    """The pipeline's drain, then its rolling thread stopped (a roll under way finished) and
    the roll of what is left: every row in a finished file."""
    from jobs.sinks.files import store as files

    figures = timed_drain(start_query(session, config, available_now=True))
    started = time.perf_counter()
    files.stop_rollers(config.pipeline)
    sink = file_sink_of(session, config)
    sink.roll(time.time(), flush=True)
    figures["seconds"] += time.perf_counter() - started
    figures["read_back"] = session.read.parquet(sink.base).count()
    figures["files"] = manifest(config.store, sink.base)
    return figures


def spark_sink_query(session, config: RunConfig, out: str, *, partition_by=(), trigger=None):
    """Spark's own Parquet file sink on the parsed columns the pipeline writes, its
    checkpoint beside its output."""
    from pyspark.sql import functions as F

    from jobs.spec.ddl import parse_schema

    checkpoint = join(parent(out), "spark-checkpoint")
    config = dataclasses.replace(config, checkpoint=checkpoint)
    columns = [f.name for f in parse_schema(config.spec.source.schema).fields]
    frame = parsed_frame(source_frame(session, config), config.spec).select(
        *[F.col(PARSED)[c].alias(c) for c in columns]
    )
    writer = (
        frame.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
    )
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    if trigger is None:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{trigger} seconds").start()


def spark_sink(session, config: RunConfig, out: str) -> dict:
    figures = timed_drain(spark_sink_query(session, config, out))
    figures["read_back"] = session.read.parquet(out).count()
    figures["files"] = visible_files(config.store, out)
    return figures


def manifest(store, base: str) -> list[dict]:
    return [json.loads(store.read_text(e.path)) for e in store.list(join(base, "_cp_manifest"))]


def visible_files(store, base: str) -> list[int]:
    """The sizes of the Parquet files a reader of `base` sees (no `_`/`.` names)."""
    sizes = []
    for entry in store.walk(base):
        relative = entry.path[len(base.rstrip("/")) + 1 :]
        if entry.name.endswith(".parquet") and not any(
            part.startswith(("_", ".")) for part in relative.split("/")
        ):
            sizes.append(entry.size)
    return sizes


def size_figures(sizes: list[int], target: int | None = None) -> dict:
    ordered = sorted(sizes)
    out = {
        "files": len(ordered),
        "median_bytes": round(statistics.median(ordered)) if ordered else 0,
        "min_bytes": ordered[0] if ordered else 0,
        "max_bytes": ordered[-1] if ordered else 0,
    }
    if target:
        out["median_to_target"] = round(out["median_bytes"] / target, 3) if ordered else None
        out["within_10_percent"] = sum(abs(s / target - 1) <= SIZE_BAND for s in ordered)
    return out


def files_on_hdfs(spark, args, roots, bootstrap, work: Path, suffix, cleanup) -> dict:
    topic = f"bench-storage-files-{suffix}"
    cleanup["topics"].append(topic)
    started = time.perf_counter()
    produce(bootstrap, topic, args.events, partitions=4)
    print(f"\nproduced {args.events:,} events in {time.perf_counter() - started:.1f} s", flush=True)
    session = session_for(spark, "hdfs", roots["hdfs"])
    store = storage_for(roots["hdfs"], settings_for("hdfs"))
    target = args.throughput_target_mb * 2**20
    rates: dict[str, list[float]] = {"ours": [], "spark": []}
    our_sizes: list[int] = []
    spark_sizes: list[list[int]] = []
    for round_ in range(args.file_rounds + 1):
        order = ("ours", "spark") if round_ % 2 == 0 else ("spark", "ours")
        for path in order:
            root = join(roots["hdfs"], "files", f"{round_}-{path}")
            spec = files_spec(topic, args.per_batch, target_mb=args.throughput_target_mb)
            config = files_config(spec, root, bootstrap, work)
            if path == "ours":
                figures = ours(session, config)
            else:
                figures = spark_sink(session, config, join(root, "plain"))
            if figures["rows"] != args.events or figures["read_back"] != args.events:
                raise SystemExit(f"{path}: {figures['rows']} rows, {figures['read_back']} read")
            rate = figures["rows"] / figures["seconds"]
            if path == "ours":
                by_size = [e["bytes"] for e in figures["files"] if e["reason"] == "size"]
                detail = f"{len(figures['files'])} finished files ({len(by_size)} by size)"
                if round_:
                    our_sizes += by_size
            else:
                detail = f"{len(figures['files'])} files"
                if round_:
                    spark_sizes.append(figures["files"])
            if round_:
                rates[path].append(rate)
            print(
                f"round {round_} {path:>5} on HDFS: {figures['rows']:,} rows in"
                f" {figures['seconds']:.2f} s, {rate:,.0f} rows/s, {detail}"
                f"{' (warm-up, not counted)' if not round_ else ''}",
                flush=True,
            )
            store.remove_tree(root)
    medians = {p: round(statistics.median(v)) for p, v in rates.items()}
    throughput = {
        "events": args.events,
        "per_batch": args.per_batch,
        "partitions": 4,
        "rounds": args.file_rounds,
        "events_per_s": medians,
        "events_per_s_rounds": {p: [round(r) for r in v] for p, v in rates.items()},
        "ours_to_spark": round(medians["ours"] / medians["spark"], 3),
        # Each round's pair, taken seconds apart (the machine's speed drifts between rounds).
        "ours_to_spark_per_round": [
            round(o / p, 3) for o, p in zip(rates["ours"], rates["spark"], strict=True)
        ],
        "target": FILES_TARGET,
        "target_mb": args.throughput_target_mb,
        "ours_size_rolled_files": size_figures(our_sizes, target),
        "spark_files_per_round": size_figures(spark_sizes[0]) if spark_sizes else None,
    }
    over_time = files_over_time(session, args, roots, bootstrap, work, suffix, cleanup)
    return {"throughput": throughput, "over_time": over_time}


def files_over_time(session, args, roots, bootstrap, work, suffix, cleanup) -> dict:
    """Both sinks side by side on HDFS at a 1 s trigger for args.minutes, fed at args.rate."""
    from jobs.loadgen import ensure_topic
    from jobs.sinks.files import store as files

    topic = f"bench-storage-files-time-{suffix}"
    cleanup["topics"].append(topic)
    ensure_topic(bootstrap, topic, 4)
    count = int(args.rate * args.minutes * 60)
    producer = subprocess.Popen(
        [sys.executable, "-m", "jobs.loadgen", "--bootstrap", bootstrap, "--topic", topic,
         "--rate", str(args.rate), "--count", str(count), "--malformed", "0",
         "--partitions", "4"],
        cwd=ROOT, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    root = join(roots["hdfs"], "files-over-time")
    store = storage_for(root, settings_for("hdfs"))
    spec = files_spec(
        topic, args.rate * 10, target_mb=args.target_mb, partition_by=("status",),
        trigger_seconds=1,
    )  # fmt: skip
    config = files_config(spec, root, bootstrap, work)
    plain_out = join(root, "plain")
    our_query = start_query(session, config)
    plain = spark_sink_query(session, config, plain_out, partition_by=("status",), trigger=1)
    started = time.monotonic()
    try:
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(5)
            for q in (our_query, plain):
                if q.exception():
                    raise q.exception()
    finally:
        try:
            producer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            producer.terminate()
            producer.wait(timeout=30)
        for q in (our_query, plain):
            if q.isActive:
                q.processAllAvailable()
                q.stop()
        files.stop_rollers(config.pipeline)
    elapsed = time.monotonic() - started
    base = file_sink_of(session, config).base
    entries = manifest(store, base)
    by_size = [e["bytes"] for e in entries if e["reason"] == "size"]
    plain_sizes = visible_files(store, plain_out)
    target = args.target_mb * 2**20
    rows_finished = sum(e["rows"] for e in entries)
    figures = {
        "minutes": args.minutes,
        "seconds": round(elapsed),
        "rate": args.rate,
        "events": count,
        "partition_by": ["status"],
        "target_mb": args.target_mb,
        "ours": {
            **size_figures(by_size, target),
            "finished_files_all": len(entries),
            "rows_finished": rows_finished,
            "rows_staged": count - rows_finished,
        },
        "spark": {**size_figures(plain_sizes), "rows": session.read.parquet(plain_out).count()},
    }
    store.remove_tree(root)
    return figures


def print_files(figures: dict) -> None:
    t, o = figures["throughput"], figures["over_time"]
    met = t["ours_to_spark"] >= FILES_TARGET
    print(
        f"\n2. files sink on HDFS, {t['events']:,} events, {t['per_batch']:,} a batch, Parquet"
        f" (medians of {t['rounds']} rounds):"
    )
    print(
        f"  ours {t['events_per_s']['ours']:,} rows/s vs Spark's file sink"
        f" {t['events_per_s']['spark']:,} rows/s: x{t['ours_to_spark']}"
        f" (goal >= {FILES_TARGET}: {'met' if met else 'NOT met'});"
        f" rounds ours {t['events_per_s_rounds']['ours']}, Spark's"
        f" {t['events_per_s_rounds']['spark']}, ours / Spark's in each round"
        f" {t['ours_to_spark_per_round']}"
    )
    s = t["ours_size_rolled_files"]
    print(
        f"  ours, files rolled by size ({t['target_mb']} MB target): {s['files']}, median"
        f" {s['median_bytes'] / 2**20:.2f} MiB = x{s['median_to_target']} of the target,"
        f" {s['within_10_percent']} within 10 %; Spark's per round:"
        f" {t['spark_files_per_round']['files']} files, median"
        f" {t['spark_files_per_round']['median_bytes'] / 2**20:.2f} MiB"
    )
    ours_, spark_ = o["ours"], o["spark"]
    print(
        f"  {o['seconds']} s at a 1 s trigger, {o['rate']:,} events/s, by status, ours to a"
        f" {o['target_mb']} MB target: ours {ours_['finished_files_all']} finished files"
        f" ({ours_['files']} by size, median {ours_['median_bytes'] / 2**20:.3f} MiB ="
        f" x{ours_['median_to_target']} of the target, {ours_['within_10_percent']} within"
        f" 10 %; {ours_['rows_staged']:,} rows still staged); Spark's {spark_['files']:,} files,"
        f" median {spark_['median_bytes'] / 1024:.1f} KiB"
    )


# -- 3. restore points ---------------------------------------------------------------------


def build_state(spark, checkpoint: str, bootstrap: str, topic: str, args) -> dict:
    """A large RocksDB state, built by Spark into `checkpoint` (local) until its state
    directory holds args.state_mb or args.state_seconds have passed: a streaming aggregation
    (update mode, into the no-op sink) over keys made from a small Kafka topic (each record
    exploded into args.keys_per_record keys: 64-character hashes, each with a random
    args.value_bytes-character value, which neither RocksDB's nor the changelog's LZ4
    compresses much). From Kafka so that the checkpoint's offsets are a Kafka source's, as
    the control plane reads them."""
    from pyspark.sql import functions as F

    produce(bootstrap, topic, args.state_records, partitions=2)
    session = spark.newSession()
    session.conf.set(STATE_STORE_CONF, STATE_STORE_PROVIDERS["rocksdb"])
    session.conf.set(CHANGELOG_CONF, "true")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    # No snapshot uploads in the background (every 10 versions by default), which would add
    # the state's SST files to the checkpoint after the build stopped: the checkpoint holds
    # the state's changelogs, about as many bytes as the state itself.
    session.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "1000000")
    raw = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 2)
        .load()
    )
    keys = raw.select(
        "partition", "offset", F.explode(F.sequence(F.lit(1), F.lit(args.keys_per_record)))
    ).select(
        F.sha2(F.concat_ws("-", "partition", "offset", "col"), 256).alias("k"),
        F.expr(f"randstr({args.value_bytes})").alias("v"),
    )
    query = (
        keys.groupBy("k")
        .agg(F.max("v").alias("v"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="0 seconds")
        .start()
    )
    started = time.monotonic()
    want = args.state_mb * 2**20
    size = 0
    while time.monotonic() - started < args.state_seconds:
        time.sleep(2)
        if query.exception():
            raise query.exception()
        size = committed_size(join(checkpoint, "state"))
        if size >= want or not query.isActive:
            break
    query.stop()
    built = time.monotonic() - started
    progress = query.lastProgress or {}
    operators = progress.get("stateOperators") or [{}]
    # Until the state stores' background uploads (snapshots) are done.
    last = -1
    while (size := tree_size(join(checkpoint, "state"))[0]) != last:
        last = size
        time.sleep(6)
    total, files_ = tree_size(checkpoint)
    return {
        "build_seconds": round(built, 1),
        "keys": operators[0].get("numRowsTotal"),
        "key_chars": 64,
        "value_chars": args.value_bytes,
        "rocksdb_sst_bytes": (operators[0].get("customMetrics") or {}).get("rocksdbSstFileSize"),
        "state_bytes": size,
        "checkpoint_bytes": total,
        "checkpoint_files": files_,
        "last_batch": progress.get("batchId"),
    }


def committed_size(root: str) -> int:
    """Bytes under `root` but files still being written (their temporary names)."""
    return sum(
        e.size for e in storage_for(root).walk(root) if not checkpoint_files.is_temporary(e.name)
    )


def copy_file_for_file(spark, source: str, target: str) -> float:
    """Hadoop's FileUtil.copy of a checkpoint to another store; seconds. One upload block at
    a time to S3 (a file larger than a block is a multipart upload, and the dev stack's
    S3Proxy, with a 256 MB heap, dies of several 50-64 MB parts at once)."""
    jvm_ = spark._jvm
    conf = jvm_.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    conf.set("fs.s3a.fast.upload.active.blocks", "1")
    conf.set("fs.s3a.impl.disable.cache", "true")  # a file system with this configuration
    path = jvm_.org.apache.hadoop.fs.Path
    started = time.perf_counter()
    src, dst = path(source), path(target)
    jvm_.org.apache.hadoop.fs.FileUtil.copy(
        src.getFileSystem(conf), src, dst.getFileSystem(conf), dst, False, True, conf
    )
    return time.perf_counter() - started


def use_store(kind: str, root: str) -> None:
    """The control plane's checkpoint root (and how to reach it) on `kind`."""
    from django.conf import settings

    s = settings_for(kind)
    settings.CONTROLPLANE_CHECKPOINT_ROOT = Path(root) if kind == "local" else root
    settings.CONTROLPLANE_HDFS_HTTP_ADDRESS = s.hdfs_http
    settings.CONTROLPLANE_HDFS_USER = s.hdfs_user
    settings.CONTROLPLANE_S3_ENDPOINT = s.s3_endpoint
    settings.CONTROLPLANE_S3_ACCESS_KEY = s.s3_access_key
    settings.CONTROLPLANE_S3_SECRET_KEY = s.s3_secret_key


def restore_points_bench(spark, args, roots, bootstrap, suffix, cleanup) -> dict:
    from django.utils import timezone

    from controlplane.definitions import checkpoints as locations
    from controlplane.definitions.models import Pipeline
    from controlplane.supervision import restore_points

    name = f"bench-restore-{suffix}"
    cp_roots = {kind: join(roots[kind], "restore") for kind in STORES}
    pipeline = Pipeline.objects.create(name=name, spec={}, desired_state="stopped")
    locations_ = {}
    for kind in STORES:
        use_store(kind, cp_roots[kind])
        locations_[kind] = locations.location(name)
    print(f"\n3. building a RocksDB state (target {args.state_mb} MiB) ...", flush=True)
    topic = f"bench-storage-state-{suffix}"
    cleanup["topics"].append(topic)
    built = build_state(spark, locations_["local"], bootstrap, topic, args)
    print(
        f"  {built['keys'] or 0:,} keys, state {built['state_bytes'] / 2**20:,.0f} MiB, checkpoint"
        f" {built['checkpoint_bytes'] / 2**20:,.0f} MiB in {built['checkpoint_files']} files,"
        f" built in {built['build_seconds']} s",
        flush=True,
    )
    uploads = {}
    for kind in ("hdfs", "s3a"):
        uploads[kind] = round(copy_file_for_file(spark, locations_["local"], locations_[kind]), 1)
        print(f"  copied file for file to {kind} in {uploads[kind]} s", flush=True)
    takes: dict[str, list[float]] = {k: [] for k in STORES}
    restores: dict[str, list[float]] = {k: [] for k in STORES}
    sizes: dict[str, tuple[int, int]] = {}
    try:
        for round_ in range(args.restore_rounds):
            for kind in turn(STORES, round_):
                use_store(kind, cp_roots[kind])
                started = time.perf_counter()
                point = restore_points.take(pipeline, reason="bench", now=timezone.now())
                took = time.perf_counter() - started
                started = time.perf_counter()
                done = restore_points.restore(
                    pipeline, point.pk, user=None, reason="bench", now=timezone.now()
                )
                restored = time.perf_counter() - started
                takes[kind].append(took)
                restores[kind].append(restored)
                sizes[kind] = (point.size_bytes, point.files)
                print(
                    f"round {round_} {kind:>5}: restore point taken in {took:6.2f} s"
                    f" ({point.size_bytes / 2**20:,.0f} MiB, {point.files} files, batch"
                    f" {point.last_batch_id}), restored in {restored:6.2f} s"
                    f" (query id {done['query_id'][:8]})",
                    flush=True,
                )
    finally:
        for kind in STORES:
            use_store(kind, cp_roots[kind])
            try:
                restore_points._remove_all(name, keep=None)
            except Exception as exc:
                print(f"(could not remove the restore points on {kind}: {exc})", file=sys.stderr)
    how = {
        "local": "take: hard-linked copy cut back; restore: hard-linked copy back, renames",
        "hdfs": "take: HDFS snapshot; restore: the snapshot's files copied through WebHDFS"
        " (the control plane's Python, jobs.storage), renames",
        "s3a": "take: server-side copies (CopyObject); restore: server-side copy back, then the"
        " current checkpoint set aside and the copy moved into place, each a server-side copy"
        " and a delete",
    }
    per_store = {
        kind: {
            "take_s": [round(v, 3) for v in takes[kind]],
            "restore_s": [round(v, 3) for v in restores[kind]],
            "take_median_s": round(statistics.median(takes[kind]), 3),
            "restore_median_s": round(statistics.median(restores[kind]), 3),
            "restore_point_bytes": sizes[kind][0],
            "restore_point_files": sizes[kind][1],
            "how": how[kind],
        }
        for kind in STORES
    }
    local = per_store["local"]
    return {
        "state": built,
        "file_for_file_copy_s": uploads,
        "rounds": args.restore_rounds,
        "per_store": per_store,
        "to_local": {
            kind: {
                "take": ratio(per_store[kind]["take_median_s"], local["take_median_s"], 1),
                "restore": ratio(per_store[kind]["restore_median_s"], local["restore_median_s"], 1),
            }
            for kind in ("hdfs", "s3a")
        },
    }


def print_restore(figures: dict) -> None:
    s = figures["state"]
    print(
        f"\n3. restore points of a {s['state_bytes'] / 2**30:.2f} GiB RocksDB state"
        f" ({s['keys'] or 0:,} keys, checkpoint {s['checkpoint_files']} files), medians of"
        f" {figures['rounds']} rounds (x local disk's):"
    )
    for kind, f in figures["per_store"].items():
        x = figures["to_local"].get(kind, {})
        print(
            f"  {kind:<6} take {f['take_median_s']:7.2f} s"
            + (f" x{x['take']}" if x else "")
            + f", restore {f['restore_median_s']:7.2f} s"
            + (f" x{x['restore']}" if x else "")
            + f"  ({f['how']})"
        )


# -- the run -------------------------------------------------------------------------------


def setup_django(database: str) -> None:
    os.environ["DATABASE_URL"] = os.environ["DATABASE_URL"].rsplit("/", 1)[0] + f"/{database}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    for name in ("kafka", "jobs", "py4j"):  # Django's console handler logs INFO
        logging.getLogger(name).setLevel(logging.WARNING)


def database_admin(sql: str, url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def remove_roots(roots: dict[str, str]) -> None:
    for kind in ("hdfs", "s3a"):
        try:
            store = storage_for(roots[kind], settings_for(kind))
            if kind == "hdfs":  # HDFS deletes no directory with snapshots (part 3's)
                for entry in store.list(join(roots[kind], "restore")):
                    for snapshot in store.snapshots(entry.path):
                        store.delete_snapshot(entry.path, snapshot)
            store.remove_tree(roots[kind])
        except Exception as exc:
            print(f"(could not remove {roots[kind]}: {exc})", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="1: rounds of restarts")
    parser.add_argument("--batches", type=int, default=10, help="1: batches per round")
    parser.add_argument("--file-ops", type=int, default=10, help="1: files per store per round")
    parser.add_argument("--events", type=int, default=1_000_000, help="2: events per drain")
    parser.add_argument("--per-batch", type=int, default=250_000)
    parser.add_argument("--file-rounds", type=int, default=3)
    parser.add_argument("--throughput-target-mb", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=2, help="2: at a 1 s trigger")
    parser.add_argument("--rate", type=int, default=5_000, help="2: events/s meanwhile")
    parser.add_argument("--target-mb", type=int, default=1, help="2: target meanwhile")
    parser.add_argument("--state-mb", type=int, default=1024, help="3: the state's size")
    parser.add_argument("--state-seconds", type=float, default=240)
    parser.add_argument("--state-records", type=int, default=64, help="3: Kafka records")
    parser.add_argument("--keys-per-record", type=int, default=50_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--restore-rounds", type=int, default=2)
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "storage.json"))
    args = parser.parse_args()
    parts = {int(p) for p in args.parts.split(",")}
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    sink_dsn = os.environ.get(
        "CONTROLPLANE_SINK_DATABASE_URL",
        "postgresql://controlplane@127.0.0.1:55432/controlplane_sink",
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Who the driver is to HDFS: read by Hadoop when its JVM logs in (jobs.hadoop.driver_env).
    os.environ.update(hadoop.driver_env(everything_storage()))
    jvm.build()
    load_start = os.getloadavg()
    wait_for_services()
    pids_start, nn_conf = service_pids(), namenode_conf()
    pid_changes: list[str] = []
    outages = Outages()

    def check_services(when: str) -> None:
        now = service_pids()
        if now != pids_start:
            pid_changes.append(f"{when}: {pids_start} -> {now}")
            print(f"WARNING: a store was restarted ({when}): {now}", flush=True)

    suffix = uuid.uuid4().hex[:6]
    database = f"controlplane_bench_storage_{suffix}"
    cleanup: dict[str, list[str]] = {"topics": [], "tables": [], "pipelines": []}
    result: dict = {"machine": machine()}
    admin_url = os.environ.get("DATABASE_URL", "")
    if 3 in parts:
        database_admin(f'CREATE DATABASE "{database}"', admin_url)
        setup_django(database)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    conf = {
        k: v
        for k, v in hadoop.session_conf({**everything_storage(), "checkpoint_root": "/x"}).items()
        if k != hadoop.CHECKPOINT_MANAGER
    }
    conf.update({"spark.driver.memory": "2g", MAINTENANCE: "5s"})
    spark = bench_session(args.master, conf)
    spark.sparkContext.setLogLevel("ERROR")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp:
        work = Path(tmp)
        roots = bench_roots(f"storage-{suffix}", work / "local")
        print(f"roots: {roots}", flush=True)
        try:
            if 1 in parts:
                wait_for_services()
                result["checkpoint"] = checkpoint_overhead(
                    spark, args, roots, bootstrap, sink_dsn, work, suffix, cleanup
                )
                print_overhead(result["checkpoint"])
                check_services("after part 1")
            if 2 in parts:
                wait_for_services()
                result["files_sink_hdfs"] = files_on_hdfs(
                    spark, args, roots, bootstrap, work, suffix, cleanup
                )
                print_files(result["files_sink_hdfs"])
                check_services("after part 2")
            if 3 in parts:
                wait_for_services()
                result["restore_points"] = restore_points_bench(
                    spark, args, roots, bootstrap, suffix, cleanup
                )
                print_restore(result["restore_points"])
                check_services("after part 3")
        finally:
            spark.stop()
            remove_roots(roots)
            if cleanup["tables"]:
                drop_tables(sink_dsn, cleanup["tables"], cleanup["pipelines"])
            if cleanup["topics"]:
                delete_topics(bootstrap, cleanup["topics"])
            if 3 in parts:
                from django.db import connections

                connections.close_all()
                database_admin(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)', admin_url)
    load_end = os.getloadavg()
    met = {}
    if "files_sink_hdfs" in result:
        f = result["files_sink_hdfs"]
        met["files_sink_to_spark_at_least_0_8"] = f["throughput"]["ours_to_spark"] >= FILES_TARGET
        median = f["over_time"]["ours"].get("median_to_target")
        met["finished_file_median_within_10_percent"] = (
            median is not None and abs(median - 1) <= SIZE_BAND
        )
    result.update(
        hdfs={
            "namenode_conf": nn_conf,
            "client_conf": {
                k.removeprefix("spark.hadoop."): v
                for k, v in conf.items()
                if "locateFollowingBlock" in k or "socket-timeout" in k
            },
        },
        service_pids_start=pids_start,
        service_pids_end=service_pids(),
        services_restarted=pid_changes,
        services_down=outages.stop(),
        master=args.master,
        seconds=round(time.monotonic() - started),
        load_average_start=[round(x, 2) for x in load_start],
        load_average_end=[round(x, 2) for x in load_end],
        met=met,
    )
    print(
        f"\nNameNode: {nn_conf}; HDFS and S3 processes {pids_start} at the start,"
        f" {service_pids()} at the end{f' (RESTARTED: {pid_changes})' if pid_changes else ''};"
        f" {result['seconds']} s; load average {load_start[0]:.2f} at the start,"
        f" {load_end[0]:.2f} at the end"
    )
    line = json.dumps(result)
    print(line)
    if parts == {1, 2, 3}:
        Path(args.output).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
