"""The Avro half of bench/throughput.py (`--parts avro`): the same delivery events into Postgres
exactly once from three topics, in one run:

  json_postgres         JSON values (from_json with the spec's DDL schema)
  avro_postgres         Avro values without framing (Spark's from_avro with the spec's schema)
  avro_framed_postgres  Avro values in Confluent's wire format, their writer schema registered
                        in the schema registry (./stack registry): each value decoded by
                        controlplane.spark.ConfluentAvro (the id in its header looked up once
                        per executor, then from_avro with writer and reader schemas)

Every path is the real pipeline (jobs.pipeline.start_query, availableNow) into a table of its
own; a path's figure is rows / the sum of its batches' durations, as the other halves'. After a
warm-up round (every path once), rounds run the paths back to back in an order that turns by
one each round; medians. Target: avro_framed_postgres >= 0.9x avro_postgres (the header and
the id's lookup must cost almost nothing)."""

from __future__ import annotations

import io
import json
import os
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

TARGET = 0.9
PATHS = ("json_postgres", "avro_postgres", "avro_framed_postgres")
AVRO_SCHEMA = {
    "type": "record",
    "name": "Delivery",
    "namespace": "bench",
    "fields": [
        {"name": "delivery_id", "type": "string"},
        {"name": "courier_id", "type": "string"},
        {"name": "status", "type": "string"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
        {"name": "event_time", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def registry_url() -> str:
    return os.environ.get(
        "CONTROLPLANE_SCHEMA_REGISTRY_URL", "http://127.0.0.1:58081/apis/ccompat/v7"
    )


def produce_all(bootstrap: str, topics: dict[str, str], count: int, partitions: int) -> int:
    """The same `count` events into each topic: JSON, Avro, framed Avro; the schema's id."""
    import fastavro
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    from jobs.loadgen import events
    from jobs.registry.client import Registry

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(t, partitions, 1) for t in topics.values()])
    finally:
        admin.close()
    with Registry({"url": registry_url()}) as registry:
        schema_id = registry.register(
            f"{topics['avro_framed_postgres']}-value", json.dumps(AVRO_SCHEMA)
        )
    parsed = fastavro.parse_schema(AVRO_SCHEMA)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=524288, compression_type=None
    )
    try:
        for i, event in enumerate(events()):
            if i >= count:
                break
            partition = i % partitions
            at = datetime.fromisoformat(event["event_time"])
            record = {
                **{k: event[k] for k in ("delivery_id", "courier_id", "status", "lat", "lon")},
                "event_time": at,
            }
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, record)
            body = out.getvalue()
            producer.send(topics["json_postgres"], json.dumps(event).encode(), partition=partition)
            producer.send(topics["avro_postgres"], body, partition=partition)
            producer.send(topics["avro_framed_postgres"], header + body, partition=partition)
        producer.flush()
    finally:
        producer.close()
    return schema_id


def run_part(spark, args, bootstrap: str, sink_dsn: str) -> dict:
    """Produce, then the rounds; the part's figures."""
    from bench.throughput import SCHEMA, bench_config, delete_topics, drop_tables, timed_drain
    from jobs.pipeline import start_query

    suffix = uuid.uuid4().hex[:8]
    topics = {p: f"bench-{p.replace('_', '-')}-{suffix}" for p in PATHS}
    started = time.perf_counter()
    schema_id = produce_all(bootstrap, topics, args.events, args.partitions)
    print(
        f"produced {args.events:,} events into each of {len(topics)} topics in"
        f" {time.perf_counter() - started:.1f} s (framed: schema id {schema_id})",
        flush=True,
    )
    registry = {"url": registry_url(), "auth": "none", "timeout_seconds": 10, "wait_seconds": 60}

    def source(path: str) -> dict:
        out = {
            "connection": "k",
            "topics": [topics[path]],
            "starting_offsets": "earliest",
            "max_records_per_batch": args.per_batch,
        }
        if path == "json_postgres":
            return {**out, "schema": SCHEMA}
        out = {**out, "format": "avro", "avro_schema": json.dumps(AVRO_SCHEMA)}
        if path == "avro_framed_postgres":
            out = {
                **out,
                "avro_framing": "confluent",
                "schema_registry": {"connection": "registry"},
            }
        return out

    def run(path: str) -> dict:
        """One path over its topic, into a table of its own, dropped after."""
        table = f"bench_{path}_{uuid.uuid4().hex[:6]}"
        spec = {"source": source(path), "sink": {"connection": "pg", "table": table}}
        with tempfile.TemporaryDirectory(prefix="bench-avro-") as work:
            config = bench_config(
                spec,
                Path(work),
                bootstrap,
                "bench-avro",
                postgres={"conninfo": sink_dsn},
                registry=registry,
            )
            try:
                return timed_drain(start_query(spark, config, available_now=True))
            finally:
                drop_tables(sink_dsn, [table], [config.pipeline])

    rates: dict[str, list[float]] = {p: [] for p in PATHS}
    try:
        for round_number in range(args.rounds + 1):
            turn = round_number % len(PATHS)
            for path in PATHS[turn:] + PATHS[:turn]:
                figures = run(path)
                rate = figures["rows"] / figures["seconds"]
                warm = " (warm-up, not counted)" if round_number == 0 else ""
                print(
                    f"round {round_number} {path}: {figures['rows']:,} rows in"
                    f" {figures['seconds']:.2f} s, {rate:,.0f} rows/s{warm}",
                    flush=True,
                )
                if figures["rows"] != args.events:
                    raise SystemExit(f"{path}: {figures['rows']} rows, not {args.events}")
                if round_number:
                    rates[path].append(rate)
    finally:
        delete_topics(bootstrap, list(topics.values()))
    medians = {p: round(statistics.median(v)) for p, v in rates.items()}
    framed_to_unframed = round(medians["avro_framed_postgres"] / medians["avro_postgres"], 3)
    return {
        "events_per_s": medians,
        "events_per_s_rounds": {p: [round(r) for r in v] for p, v in rates.items()},
        "ratios": {
            "avro_framed_to_avro": framed_to_unframed,
            "avro_framed_to_json": round(
                medians["avro_framed_postgres"] / medians["json_postgres"], 3
            ),
            "avro_to_json": round(medians["avro_postgres"] / medians["json_postgres"], 3),
        },
        "target": {"avro_framed_to_avro": TARGET},
        "met": framed_to_unframed >= TARGET,
    }
