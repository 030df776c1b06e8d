"""The Cassandra half of bench/sinks.py: the cassandra sink against a bare loop of the Java
driver writing the same rows with the same concurrency (the ceiling), in one run.

  cassandra_sink     the real pipeline (jobs.pipeline.start_query, availableNow, sink kind
                     cassandra, partition key delivery_id): Kafka read, parsed, each batch's
                     rows written by the executors (controlplane.spark.CassandraWriter:
                     asynchronous, max_in_flight per task, token-aware, each row stamped
                     with its record's own position: no shuffle, nothing held back)
  cassandra_ceiling  the same number of rows of the same columns (no Kafka, no Spark) written
                     by one loop of the Java driver in the same JVM (controlplane.spark.
                     CassandraCeiling): one prepared INSERT ... USING TIMESTAMP per row, at
                     most tasks x max_in_flight in flight, through the sink's own session

Every event has a key of its own (D000000000...), so each is a row of the table: the sink has
nothing to fold within a batch (the ceiling could not either). Each round writes each path
into a fresh table, alternating which goes first; after a warm-up round, medians. A path's
figure: rows / seconds (the sink: the sum of its batches' durations, as the other halves);
beside it the request latencies (p50, p95 and p99 of send to acknowledgement, successes, from
the writer's own histogram), and Cassandra's own CPU (its process's user + system time over
the path's wall time). Target: cassandra_sink >= 0.7x cassandra_ceiling."""

from __future__ import annotations

import itertools
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from bench.throughput import bench_config, bench_source, tree_cpu_seconds

TARGET = 0.7
PATHS = ("cassandra_sink", "cassandra_ceiling")
COLUMNS = (
    '"delivery_id" text, "courier_id" text, "status" text, "lat" double, "lon" double,'
    ' "event_time" timestamp, "note" text'
)
SCHEMA_WITH_NOTE = (
    "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE, lon DOUBLE, "
    "event_time TIMESTAMP, note STRING"
)
MAX_IN_FLIGHT = 128


def arguments(keyspace: str) -> dict:
    """The cassandra connection's arguments, from ./stack cassandra's variables."""
    return {
        "contact_points": os.environ.get("CONTROLPLANE_CASSANDRA_HOSTS", "127.0.0.1:59042").split(
            ","
        ),
        "local_datacenter": os.environ.get("CONTROLPLANE_CASSANDRA_DC", "datacenter1"),
        "keyspace": keyspace,
        "username": os.environ.get("CONTROLPLANE_CASSANDRA_USER", "cassandra"),
        "password": os.environ.get("CONTROLPLANE_CASSANDRA_PASSWORD", "cassandra"),
        "tls": None,
    }


def cassandra_pid() -> int | None:
    """The Cassandra node's process (CassandraDaemon), found by its command line."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (
                    b"org.apache.cassandra.service.CassandraDaemon"
                    in (entry / "cmdline").read_bytes()
                ):
                    return int(entry.name)
            except OSError:
                continue
    return None


def count_rows(session, keyspace: str, table: str, ranges: int = 64) -> int:
    """The table's rows, counted over token ranges (one count(*) of millions of rows times
    out on a small node)."""
    low, high = -(2**63), 2**63 - 1
    step = (high - low) // ranges
    bounds = [low + i * step for i in range(ranges)] + [high]
    query = session.prepare(
        f'SELECT count(*) FROM {keyspace}."{table}" WHERE token("delivery_id") > ?'  # noqa: S608
        ' AND token("delivery_id") <= ?'
    )
    # (No key has the lowest token: Murmur3 gives Long.MIN_VALUE's keys Long.MAX_VALUE.)
    total = 0
    for start, end in itertools.pairwise(bounds):
        total += session.execute(query, [start, end], timeout=120).one()[0]
    return total


def produce_unique(bootstrap: str, topic: str, count: int, partitions: int) -> None:
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=524288, compression_type=None
    )
    statuses = ("created", "assigned", "picked_up", "in_transit", "delivered")
    try:
        for i in range(count):
            event = {
                "delivery_id": f"D{i:09d}",
                "courier_id": f"C{i % 997:04d}",
                "status": statuses[i % 5],
                "lat": 55.70 + (i % 1000) / 10000,
                "lon": 37.50 + (i % 2000) / 10000,
                "event_time": "2026-11-28T10:00:00.000Z",
                "note": "ok",
            }
            producer.send(topic, json.dumps(event).encode(), partition=i % partitions)
        producer.flush()
    finally:
        producer.close()


def run_part(spark, args, bootstrap: str) -> dict:
    """Produce, then the rounds; the part's figures."""
    from bench.throughput import timed_drain
    from jobs.pipeline import start_query
    from jobs.sinks.cassandra.connection import session as open_session

    keyspace = f"bench_{uuid.uuid4().hex[:8]}"
    cass = open_session({**arguments(None), "keyspace": None})
    cass.execute(
        f"CREATE KEYSPACE {keyspace} WITH replication ="
        " {'class': 'SimpleStrategy', 'replication_factor': 1}"
    )
    topic = f"bench-c-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    produce_unique(bootstrap, topic, args.events, args.partitions)
    print(
        f"produced {args.events:,} events with keys of their own in"
        f" {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    jvm = spark._jvm.controlplane.spark
    pid = cassandra_pid()
    tasks = spark.sparkContext.defaultParallelism

    def sink(work: Path, table: str) -> dict:
        spec = {
            "source": {**bench_source(topic, args.per_batch), "schema": SCHEMA_WITH_NOTE},
            "sink": {
                "kind": "cassandra",
                "connection": "c",
                "table": table,
                "partition_key": ["delivery_id"],
                "consistency": "ONE",
                "max_in_flight": MAX_IN_FLIGHT,
                "dead_letters": {"connection": "pg"},
            },
        }
        config = bench_config(
            spec,
            work,
            bootstrap,
            "bench-c",
            sink_configs=({"cassandra": arguments(keyspace), "postgres": {}},),
        )
        return timed_drain(start_query(spark, config, available_now=True))

    def ceiling(work: Path, table: str) -> dict:
        cass.execute(f'CREATE TABLE {keyspace}."{table}" ({COLUMNS}, PRIMARY KEY ("delivery_id"))')
        config = {
            **{k: v for k, v in arguments(keyspace).items() if k != "keyspace"},
            "keyspace": keyspace,
            "table": table,
            "columns": [{"name": "delivery_id", "ordinal": 0}],
            "partition_key": ["delivery_id"],
            "primary_key": ["delivery_id"],
            "order_ordinal": -1,
            "write_time": {"constant": 1},
            "consistency": "ONE",
        }
        seconds = jvm.CassandraCeiling.run(json.dumps(config), args.events, tasks * MAX_IN_FLIGHT)
        return {"rows": args.events, "seconds": float(seconds)}

    rates: dict[str, list[float]] = {p: [] for p in PATHS}
    latency: dict[str, list[list[float]]] = {p: [] for p in PATHS}
    cpu: dict[str, list[float]] = {p: [] for p in PATHS}
    try:
        for round_number in range(args.rounds + 1):
            order = PATHS if round_number % 2 == 0 else PATHS[::-1]
            for path in order:
                table = f"{path}_{round_number}"
                jvm.CassandraWriter.resetLatencies()
                cpu_before, wall_before = tree_cpu_seconds(pid), time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="bench-cassandra-") as work:
                    figures = (sink if path == "cassandra_sink" else ceiling)(Path(work), table)
                wall = time.perf_counter() - wall_before
                share = (tree_cpu_seconds(pid) - cpu_before) / wall if pid else float("nan")
                count, p50, p95, p99 = list(jvm.CassandraWriter.latencies())
                found = count_rows(cass, keyspace, table)
                rate = figures["rows"] / figures["seconds"]
                warm = " (warm-up, not counted)" if round_number == 0 else ""
                print(
                    f"round {round_number} {path}: {figures['rows']:,} rows in"
                    f" {figures['seconds']:.2f} s, {rate:,.0f} rows/s; requests {int(count):,},"
                    f" p50 {p50:.2f} ms, p95 {p95:.2f} ms, p99 {p99:.2f} ms; Cassandra CPU"
                    f" {share:.2f} cores; {found:,} rows in the table{warm}",
                    flush=True,
                )
                if found != args.events or figures["rows"] != args.events:
                    raise SystemExit(f"{path}: {found} rows in the table, not {args.events}")
                if round_number:
                    rates[path].append(rate)
                    latency[path].append([p50, p95, p99])
                    cpu[path].append(share)
                cass.execute(f'DROP TABLE {keyspace}."{table}"', timeout=120)
    finally:
        cass.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)
        cass.cluster.shutdown()
        from bench.throughput import delete_topics

        delete_topics(bootstrap, [topic])
    medians = {p: round(statistics.median(v)) for p, v in rates.items()}
    ratio = round(medians["cassandra_sink"] / medians["cassandra_ceiling"], 3)
    return {
        "events_per_s": medians,
        "events_per_s_rounds": {p: [round(r) for r in v] for p, v in rates.items()},
        "latency_ms_p50_p95_p99": {
            p: [round(statistics.median(x[i] for x in v), 2) for i in range(3)]
            for p, v in latency.items()
        },
        "cassandra_cpu_cores": {p: round(statistics.median(v), 2) for p, v in cpu.items()},
        "ratio_sink_to_ceiling": ratio,
        "target": TARGET,
        "met": ratio >= TARGET,
        "max_in_flight_per_task": MAX_IN_FLIGHT,
        "tasks": tasks,
    }
