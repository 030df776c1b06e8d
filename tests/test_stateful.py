"""Stateful pipelines with real Spark, Kafka and Postgres: event-time windows written once
when the watermark finishes them (append) or as running counts upserted by group (update),
deduplication within the watermark across restarts, late records dropped and counted, dead
letters beside the stateful output, and the state store a checkpoint keeps."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.supervision.restarts import classify
from jobs.checkpoints import planned_conf
from jobs.pipeline import start_query
from jobs.reporting import ProgressPoller
from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from jobs.stateful import STATE_STORE_CONF, STATE_STORE_PROVIDERS, StateStoreError, source_reads
from tests.kafka_helpers import new_topic, produce, read_committed
from tests.spark_helpers import drain, fetch, forget_last_commit
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

BASE = datetime(2026, 11, 24, tzinfo=UTC)
MALFORMED = b"{not json"
COUNTS = "SELECT window.start AS window_start, window.end AS window_end, courier, count(*) AS n"
TUMBLING = f"{COUNTS} FROM source GROUP BY window(ts, '1 minute'), courier"


def at(minute: float) -> str:
    return (BASE + timedelta(minutes=minute)).isoformat().replace("+00:00", "Z")


def deliveries(windows: range, couriers=("ann", "bob")) -> tuple[list[dict], dict]:
    """Records in 1-minute windows, a known number per (window, courier): (records, counts
    by (minute, courier))."""
    records, counts = [], {}
    for w in windows:
        for c, courier in enumerate(couriers):
            n = 5 + 3 * w + c
            counts[(w, courier)] = n
            for i in range(n):
                records.append(
                    {"id": f"{w}-{courier}-{i}", "courier": courier, "ts": at(w + (i % 60) / 61)}
                )
    return records, counts


def config_for(tmp_path: Path, topic: str, sink_dsn: str, spec: dict, name: str = "") -> RunConfig:
    """The spec's run configuration: its sinks' clients by kind (files under tmp_path/lake)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    client = {"bootstrap_servers": [pytest.kafka_bootstrap]}
    clients = {
        "postgres": {"postgres": {"conninfo": sink_dsn}},
        "kafka": {"kafka": client},
        "files": {"files": {"root": (tmp_path / "lake").as_uri()}},
    }
    return RunConfig(
        pipeline=name or f"s-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka=client,
        postgres={"conninfo": sink_dsn},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(run_dir),
        sink_configs=tuple(clients[s.get("kind", "postgres")] for s in spec.get("sinks", [])),
    )


def spec_for(topic: str, table: str, **extra) -> dict:
    source = {
        "connection": "k",
        "topics": [topic],
        "schema": "id STRING, courier STRING, ts TIMESTAMP",
        "starting_offsets": "earliest",
        "max_records_per_batch": 200,
        "watermark": {"column": "ts", "delay_seconds": 30},
    }
    source.update(extra.pop("source", {}))
    if "sinks" not in extra:
        extra.setdefault("sink", {"connection": "pg", "table": table})
    return {"source": source, **extra}


@pytest.fixture(autouse=True)
def _bootstrap(kafka_bootstrap):
    pytest.kafka_bootstrap = kafka_bootstrap


def windows_in(dsn, table) -> dict:
    rows = fetch(dsn, f'SELECT window_start, courier, n FROM "{table}"')
    return {(int((s - BASE).total_seconds() // 60), c): n for s, c, n in rows}


def finished_rows(spark, lake: Path) -> list:
    """The rows of the files sink's finished files (none before the first)."""
    # The visible directory only: the sink deletes rolled batches' staging meanwhile.
    if not any(p.suffix == ".json" and p.name.startswith("part-") for p in lake.glob("*")):
        return []
    return spark.read.json(str(lake)).collect()


def dropped_by_watermark(query) -> int:
    return sum(
        op.get("numRowsDroppedByWatermark", 0)
        for p in query.recentProgress
        for op in json.loads(p.json).get("stateOperators", [])
    )


def test_finished_windows_are_written_once_and_late_records_are_dropped_and_counted(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap, partitions=2)
    records, counts = deliveries(range(5))
    produce(kafka_bootstrap, topic, [*records, MALFORMED], partitions=2)
    table = f"w_{uuid.uuid4().hex[:8]}"
    lake = {
        "kind": "files",
        "connection": "lake",
        "path": "windows",
        "format": "json",
        "inactivity_seconds": 0.5,
    }
    # With a HyperLogLog count beside the exact one (every id is distinct).
    sql = TUMBLING.replace("count(*) AS n", "count(*) AS n, approx_count_distinct(id, 0.01) AS ids")
    spec = spec_for(
        topic,
        table,
        transform={"sql": sql, "output_mode": "append"},
        sinks=[{"connection": "pg", "table": table}, lake],
    )
    config = config_for(tmp_path, topic, sink_dsn, spec)
    drain(spark, config)
    # The watermark is the latest record's time (4:16) less 30 s: windows 0-2 are finished.
    assert max(r["ts"] for r in records) == at(4 + 17 / 61)
    assert windows_in(sink_dsn, table) == {k: n for k, n in counts.items() if k[0] < 3}
    # Minute 9 moves it to 8:30: window 4 is finished too, 9 is still open.
    produce(kafka_bootstrap, topic, [{"id": "x", "courier": "ann", "ts": at(9)}], partitions=2)
    drain(spark, config)
    assert windows_in(sink_dsn, table) == counts
    letters = fetch(
        sink_dsn, f"SELECT raw FROM _cp_dead_letters WHERE pipeline = '{config.pipeline}'"
    )
    assert [bytes(v) for (v,) in letters] == [MALFORMED]
    # Spark's offset log keeps the store: RocksDB unless the spec says otherwise.
    assert planned_conf(config.checkpoint)[STATE_STORE_CONF] == STATE_STORE_PROVIDERS["rocksdb"]

    # Records of finished windows come late: dropped by the watermark, counted, never written.
    # (Spark counts the rows that reach its stateful operator, after the partial aggregation
    # of each input partition: late records of three groups, three rows.)
    late = [{"id": f"late{i}", "courier": "bob", "ts": at(i + 0.5)} for i in range(3)]
    produce(kafka_bootstrap, topic, late, partitions=2)
    query = drain(spark, config)
    assert dropped_by_watermark(query) == 3
    # Each batch reads its offsets twice (state, dead letters); the progress the job reports
    # counts records: 3.
    handed = []
    ProgressPoller(query, [handed.append], source_reads=source_reads(config.spec)).poll()
    assert sum(p["numInputRows"] for p in handed) == 3
    assert sum(json.loads(p.json)["numInputRows"] for p in query.recentProgress) == 6
    produce(kafka_bootstrap, topic, [{"id": "y", "courier": "bob", "ts": at(12)}], partitions=2)
    drain(spark, config)
    found = windows_in(sink_dsn, table)
    assert {k: v for k, v in found.items() if k[0] < 5} == counts
    assert found.get((9, "ann")) == 1  # finished by minute 12's watermark (11:30)
    for n, ids in fetch(sink_dsn, f'SELECT n, ids FROM "{table}"'):
        assert abs(ids - n) <= max(1, n // 10), (n, ids)
    assert (12, "bob") not in found
    # The files sink beside it: each finished window once, in finished files (the last
    # ones rolled after a second without rows, while the pipeline runs).
    lake_dir = tmp_path / "lake" / "windows"
    query = start_query(spark, config)
    try:
        # Every 0.5 s: each poll is a Spark read of the finished files.
        wait_for(lambda: len(finished_rows(spark, lake_dir)) >= len(found), 60, every=0.5)
    finally:
        query.stop()
    rows = finished_rows(spark, lake_dir)
    in_files = {(r.window_start, r.courier): r.n for r in rows}
    assert len(rows) == len(in_files) == len(found)
    assert sorted(in_files.values()) == sorted(found.values())


def test_update_output_upserts_running_counts_by_group_exactly_once_on_replay(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap, partitions=2)
    first, _ = deliveries(range(3))
    produce(kafka_bootstrap, topic, first, partitions=2)
    table = f"u_{uuid.uuid4().hex[:8]}"
    out, dead = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    spec = spec_for(
        topic,
        table,
        transform={"sql": TUMBLING, "output_mode": "update"},
        sinks=[
            {
                "connection": "pg",
                "table": table,
                "mode": "upsert",
                "key": ["window_start", "window_end", "courier"],
            },
            # Kafka takes update output keyed by the group: a changelog of running counts.
            {
                "kind": "kafka",
                "connection": "k",
                "topic": out,
                "dead_letter_topic": dead,
                "key": "concat(courier, '@', window_start)",
            },
        ],
        state_store="hdfs",
        # 10 minutes late at most: every window of this test stays open.
        source={"watermark": {"column": "ts", "delay_seconds": 600}},
    )
    config = config_for(tmp_path, topic, sink_dsn, spec)
    drain(spark, config)
    assert planned_conf(config.checkpoint)[STATE_STORE_CONF] == STATE_STORE_PROVIDERS["hdfs"]
    # More records of the same windows (still open: no watermark has passed them), replayed
    # once as if the driver died after the sink's commit: counts go on from the state.
    more, _ = deliveries(range(3))
    produce(kafka_bootstrap, topic, more, partitions=2)
    drain(spark, config)
    forget_last_commit(config.checkpoint)
    drain(spark, config)
    _, counts = deliveries(range(3))
    assert windows_in(sink_dsn, table) == {k: 2 * n for k, n in counts.items()}
    (rows,) = fetch(sink_dsn, f'SELECT count(*) FROM "{table}"')[0]
    assert rows == len(counts)
    # The changelog: per group, the counts after each batch that changed it, the replayed
    # batch's once; the last is the count in the table.
    latest = {}
    for key, value, _ in read_committed(kafka_bootstrap, out):
        latest[key] = json.loads(value)["n"]
    assert sorted(latest.values()) == sorted(2 * n for n in counts.values())

    # The checkpoint keeps its store: asking for another is a definition error, not ignored.
    changed = config_for(tmp_path, topic, sink_dsn, {**spec, "state_store": "rocksdb"})
    with pytest.raises(StateStoreError) as raised:
        start_query(spark, changed, available_now=True)
    assert classify(f"{type(raised.value).__name__}: {raised.value}") == "a definition error"


def test_deduplication_within_the_watermark_holds_across_restarts(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap, partitions=2)
    table = f"d_{uuid.uuid4().hex[:8]}"

    def event(i: int, minute: float) -> dict:
        return {"id": f"e{i}", "courier": "ann", "ts": at(minute)}

    # Every id twice or three times, in one run and across the next.
    produce(kafka_bootstrap, topic, [event(i, i / 100) for i in range(100)] * 2, partitions=2)
    spec = spec_for(topic, table, source={"deduplicate": {"key": ["id"]}})
    config = config_for(tmp_path, topic, sink_dsn, spec)
    drain(spark, config)
    produce(kafka_bootstrap, topic, [event(i, i / 100 + 0.5) for i in range(50, 150)], partitions=2)
    drain(spark, config)
    rows = fetch(sink_dsn, f'SELECT id, count(*) FROM "{table}" GROUP BY id')
    assert dict(rows) == {f"e{i}": 1 for i in range(150)}


def test_a_state_schema_the_checkpoint_cannot_restore_is_a_definition_error(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap, partitions=1)
    records, _ = deliveries(range(2))
    produce(kafka_bootstrap, topic, records, partitions=1)
    table = f"c_{uuid.uuid4().hex[:8]}"
    spec = spec_for(topic, table, transform={"sql": TUMBLING, "output_mode": "append"})
    drain(spark, config_for(tmp_path, topic, sink_dsn, spec))
    produce(kafka_bootstrap, topic, records, partitions=1)
    # The group key gains a column: the state's key schema no longer matches.
    wider = TUMBLING.replace("courier", "courier, id")
    spec["transform"]["sql"] = wider.replace("count(*) AS n", "count(*) AS n", 1)
    spec["sink"]["table"] = f"{table}_2"
    query = start_query(spark, config_for(tmp_path, topic, sink_dsn, spec), available_now=True)
    with pytest.raises(Exception) as raised:  # pyspark's StreamingQueryException
        query.awaitTermination(180)
    assert "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE" in str(raised.value)
    assert classify(str(raised.value)) == "a state the checkpoint cannot restore"
