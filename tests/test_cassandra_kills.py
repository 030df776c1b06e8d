"""Kafka -> Cassandra exactly once under kill -9: a real spark-submit driver of a pipeline with
a cassandra sink, supervised by the control plane, is SIGKILLed three times while it drains a
backlog of updates to the same keys (each key updated many times, in many batches). The final
table equals the one a run without kills writes (the same query in the test's own Spark
session, into a table of its own): every key's value, and its write time, which is its last
record's position in the source (the same batches, cut the same way from the same offset log:
a replayed batch is the batch it was)."""

from __future__ import annotations

import json
import os
import signal
import uuid

import psycopg
import pytest
from kafka import KafkaProducer

from controlplane.definitions import checkpoints
from controlplane.definitions.models import Run, RunState
from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic
from tests.runs import driver_pid, reconcile_until, restarted_after_kill
from tests.spark_helpers import drain
from tests.stores import cassandra_session
from tests.test_cassandra_sink import cassandra_arguments

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

KEYS = 300
RECORDS = 20_000
PARTITIONS = 3


def produce_updates(bootstrap: str, topic: str, records: int = RECORDS) -> None:
    """`records` updates of KEYS keys, each key always in the same partition (so its last
    record is the last by offset), one malformed record."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=262144)
    try:
        for i in range(records):
            key = i % KEYS
            value = {"id": f"k{key}", "n": i, "at": "2026-11-28T10:00:00Z"}
            producer.send(topic, json.dumps(value).encode(), partition=key % PARTITIONS)
        producer.send(topic, b"{not json", partition=0)
        producer.flush()
    finally:
        producer.close()


def table_state(table: str) -> dict[str, tuple[int, int]]:
    with cassandra_session("cp_test") as session:
        return {
            r.id: (r.n, r.stamp)
            for r in session.execute(f"SELECT id, n, writetime(n) AS stamp FROM {table}")
        }


def test_the_table_equals_a_run_without_kills_after_three_sigkills(
    api,
    kafka_connection,
    postgres_connection,
    cassandra_connection,
    kafka_bootstrap,
    sink_dsn,
    job_dirs,
    spark,
    tmp_path,
):
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS)
    suffix = uuid.uuid4().hex[:8]
    killed_table, steady_table = f"killed_{suffix}", f"steady_{suffix}"

    def spec(table: str) -> dict:
        return {
            "source": {
                "connection": "events",
                "topics": [topic],
                "schema": "id STRING, n INT, at TIMESTAMP",
                "starting_offsets": "earliest",
                "max_records_per_batch": 1000,
                "min_partitions": PARTITIONS,
            },
            "sink": {
                "kind": "cassandra",
                "connection": "cluster",
                "table": table,
                "partition_key": ["id"],
                "dead_letters": {"connection": "warehouse"},
            },
            "trigger": {"interval_seconds": 0},
            "restart_policy": {"kind": "fixed-delay", "attempts": 6, "delay_seconds": 1},
        }

    produce_updates(kafka_bootstrap, topic)
    response = api.post(
        "/api/pipelines/", {"name": "c-kill", "spec": spec(killed_table)}, format="json"
    )
    assert response.status_code == 201, response.json()
    api.post("/api/pipelines/c-kill/start/")

    def written() -> int:
        try:
            return len(table_state(killed_table))
        except Exception:
            return 0

    def committed() -> int:
        found = checkpoints.read("c-kill", sizes=False)
        return sum(found.committed_offsets().values()) if found else 0

    reconcile_until("c-kill", lambda: written() > 0, 240, "the first rows")
    for kill in range(3):
        run = Run.objects.get(pipeline__name="c-kill", state=RunState.RUNNING)
        before = committed()
        # Killed while it drains: after it committed one more batch since its (re)start.
        reconcile_until(
            "c-kill", lambda b=before: committed() > b, 180, f"a batch before kill {kill}"
        )
        assert committed() < RECORDS + 1, "drained before the kill: no load left"
        os.kill(driver_pid(run), signal.SIGKILL)
        restarted_after_kill("c-kill", run, f"the restart after kill {kill}")
    reconcile_until("c-kill", lambda: committed() == RECORDS + 1, 300, "the end of the backlog")

    # The same query without kills, in the test's own Spark session.
    steady = RunConfig(
        pipeline="c-steady",
        spec=parse_spec({**spec(steady_table), "trigger": {"interval_seconds": 0}}),
        kafka={"bootstrap_servers": [kafka_bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / "steady" / "checkpoint"),
        run_dir=str(tmp_path),
        sink_configs=(
            {
                "cassandra": cassandra_arguments("cp_test"),
                "postgres": {"conninfo": sink_dsn},
            },
        ),
    )
    drain(spark, steady)
    killed, without = table_state(killed_table), table_state(steady_table)
    assert len(without) == KEYS
    assert killed == without
    # Every key's last update won.
    assert {k: n for k, (n, _) in killed.items()} == {
        f"k{key}": key + KEYS * ((RECORDS - 1 - key) // KEYS) for key in range(KEYS)
    }
    # The malformed record is a dead letter of each run, once.
    with psycopg.connect(sink_dsn) as conn:
        found = conn.execute(
            "SELECT pipeline, count(*) FROM _cp_dead_letters WHERE pipeline IN"
            " ('c-kill', 'c-steady') GROUP BY pipeline ORDER BY pipeline"
        ).fetchall()
    assert found == [("c-kill", 1), ("c-steady", 1)]
