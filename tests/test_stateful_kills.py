"""A 1-minute tumbling count under kill -9: a real spark-submit driver of a stateful pipeline
(watermark, windows in append mode, RocksDB state), supervised by the control plane, its
checkpoint on the S3 server (the state store's files with it, written in place by
jobs.hadoop's no-rename checkpoint manager; tests.kill_stores), is SIGKILLed three times
while records keep arriving. Every window is written once, with its exact count, into
Postgres, into a Kafka topic (read_committed) and into finished files of a files sink on
the S3 server (staged without renames, rolled by single uploads), and every record that did
not parse once as a dead letter, whatever batch, state version, sink transaction or roll each
kill interrupted. (A files sink on HDFS is killed in tests/test_kafka_sink_kills.py.)"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from controlplane.definitions import checkpoints
from controlplane.definitions.models import Pipeline, Run, RunState
from tests.kafka_helpers import new_topic, produce, read_committed
from tests.kill_stores import finished_files, manifest, off_disk, staged_rows
from tests.runs import driver_pid, reconcile_until, restarted_after_kill

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

BASE = datetime(2026, 11, 24, tzinfo=UTC)
MALFORMED = b"{not json"
COURIERS = ("ann", "bob", "cy")


def at(ms: int) -> str:
    return (BASE + timedelta(milliseconds=ms)).isoformat().replace("+00:00", "Z")


def windows(table: str, dsn: str) -> list[tuple]:
    with psycopg.connect(dsn) as conn:
        try:
            return conn.execute(f'SELECT window_start, courier, n FROM "{table}"').fetchall()
        except psycopg.errors.UndefinedTable:
            return []


@pytest.fixture
def s3(api, settings, tmp_path, job_dirs):
    """The checkpoint root on S3, removed at the end."""
    yield from off_disk("s3", api, settings, tmp_path)


def test_a_tumbling_count_is_exact_after_three_kill_9s(
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    job_dirs,
    s3,
):
    source = new_topic(kafka_bootstrap, partitions=2)
    out, dead = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    table = f"tumbling_{source.replace('-', '_')}"
    body = {
        "source": {
            "connection": "events",
            "topics": [source],
            "schema": "id STRING, courier STRING, ts TIMESTAMP",
            "starting_offsets": "earliest",
            "max_records_per_batch": 600,
            "watermark": {"column": "ts", "delay_seconds": 20},
        },
        "transform": {
            "sql": "SELECT window.start AS window_start, window.end AS window_end, courier,"
            " count(*) AS n FROM source GROUP BY window(ts, '1 minute'), courier",
            "output_mode": "append",
        },
        "sinks": [
            {"connection": "warehouse", "table": table},
            {
                "kind": "kafka",
                "connection": "events",
                "topic": out,
                "dead_letter_topic": dead,
                "key": "courier",
            },
            {
                "kind": "files",
                "connection": "lake",
                "path": "windows",
                "format": "json",
                "target_file_mb": 1,
                "max_file_age_seconds": 3600,
                "inactivity_seconds": 10,
            },
        ],
        "trigger": {"interval_seconds": 0},
        "restart_policy": {"kind": "fixed-delay", "attempts": 6, "delay_seconds": 1},
    }
    response = api.post("/api/pipelines/", {"name": "tumbling", "spec": body}, format="json")
    assert response.status_code == 201, response.json()
    expected: Counter = Counter()
    produced, clock = 0, 0  # event time, in milliseconds

    def produce_minutes(minutes: int) -> None:
        """`minutes` more minutes of deliveries, in event-time order, a different number per
        courier and minute (1 record per 0.1-0.2 s of event time)."""
        nonlocal produced, clock
        records = []
        end = clock + 60_000 * minutes
        while clock < end:
            courier = COURIERS[produced % len(COURIERS)]
            minute = clock // 60_000
            records.append({"id": f"r{produced}", "courier": courier, "ts": at(clock)})
            expected[(minute, courier)] += 1
            produced += 1
            clock += 100 + 50 * ((produced * 7) % 3)
        produce(kafka_bootstrap, source, records, partitions=2, start=produced - len(records))
        # A record that does not parse after each part: its dead letter, and the batch after
        # it takes the writers' paths that follow a batch with dead letters.
        produce(kafka_bootstrap, source, [MALFORMED], partitions=2, start=produced)

    def committed() -> int:
        found = checkpoints.read("tumbling", sizes=False)
        return sum(found.committed_offsets().values()) if found else 0

    produce_minutes(3)
    api.post("/api/pipelines/tumbling/start/")
    reconcile_until("tumbling", lambda: len(windows(table, sink_dsn)) > 0, 180, "the first windows")
    # The checkpoint is on S3, nothing of it on the local disk.
    assert checkpoints.read("tumbling", sizes=False).path.startswith(f"{s3.root}/checkpoints/")
    assert not (job_dirs / "checkpoints").exists()
    for kill in range(3):
        before = committed()
        produce_minutes(3)  # several batches in flight when the driver dies
        if kill == 2:
            # A record 10 minutes on moves the watermark past every window produced.
            last_minute = (clock - 1) // 60_000
            flush = {"id": "end", "courier": "ann", "ts": at(clock + 600_000)}
            produce(kafka_bootstrap, source, [flush], partitions=2, start=produced)
        reconcile_until("tumbling", lambda b=before: committed() > b, 120, f"a batch {kill}")
        run = Run.objects.get(pipeline__name="tumbling", state=RunState.RUNNING)
        os.kill(driver_pid(run), signal.SIGKILL)
        restarted_after_kill("tumbling", run, f"the restart after kill {kill}")
    finished = {k: n for k, n in expected.items() if k[0] <= last_minute}
    reconcile_until(
        "tumbling", lambda: len(windows(table, sink_dsn)) >= len(finished), 240, "every window"
    )
    rows = windows(table, sink_dsn)
    found = {(int((s - BASE).total_seconds() // 60), c): n for s, c, n in rows}
    assert len(rows) == len(found) == len(finished)  # each window once
    assert found == finished
    # The Kafka sink: each window once, with the same count, for read_committed readers.
    records = [json.loads(v) for _, v, _ in read_committed(kafka_bootstrap, out)]
    by_window = Counter((r["window_start"], r["courier"]) for r in records)
    assert set(by_window.values()) == {1} and len(records) == len(finished)
    assert sum(r["n"] for r in records) == sum(finished.values())
    # The files sink on S3: each window once in its finished files, once the last rows
    # rolled (10 s without new ones).
    lake = s3.base("windows")

    def rolled() -> list[dict]:
        return [
            json.loads(line)
            for name in finished_files(s3.store, lake)
            for line in s3.store.read_text(f"{lake}/{name}").splitlines()
        ]

    reconcile_until(
        "tumbling",
        lambda: not staged_rows(s3.store, lake) and len(rolled()) >= len(finished),
        120,
        "the last roll",
    )
    visible = finished_files(s3.store, lake)
    assert visible and all(name.endswith(".json") for name in visible), visible
    in_files = rolled()
    by_file = Counter((r["window_start"], r["courier"]) for r in in_files)
    assert set(by_file.values()) == {1} and len(in_files) == len(finished)
    assert sum(r["n"] for r in in_files) == sum(finished.values())
    assert sorted(e["file"] for e in manifest(s3.store, lake)) == visible
    with psycopg.connect(sink_dsn) as conn:
        # This run's (the table is shared by every run of the suite against this database).
        letters = conn.execute(
            "SELECT raw FROM _cp_dead_letters WHERE pipeline = 'tumbling' AND topic = %s",
            (source,),
        ).fetchall()
    assert [bytes(r) for (r,) in letters] == [MALFORMED] * 4
    pipeline = Pipeline.objects.get(name="tumbling")
    assert (pipeline.restarts, pipeline.failures.count()) == (3, 3)
    api.post("/api/pipelines/tumbling/stop/")
    reconcile_until(
        "tumbling", lambda: Pipeline.objects.get(name="tumbling").status == "stopped", 120, "stop"
    )
