"""Kafka -> Kafka and Postgres exactly once under kill -9: a real spark-submit driver of a
pipeline with two sinks (a Kafka topic, then a Postgres table), supervised by the control
plane, is SIGKILLed again and again while records keep arriving, at moments when one of its
Kafka transactions is open (the output's high watermark is above its last stable offset, and
stays there after the kill). A `read_committed` consumer of the output sees every record
once, the dead letters once, and the table has every record once. (Twice, not more: each
restart is a cold start of a dedicated driver, and the suite's time is budgeted.)"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from controlplane.definitions.models import Pipeline, Run, RunState
from jobs.checkpoints import read_checkpoint
from tests.kafka_helpers import new_topic, produce
from tests.test_kafka_sink import read_committed
from tests.test_launch_and_stop import (  # noqa: F401 - job_dirs: a fixture
    driver_pid,
    job_dirs,
    reconcile_until,
    restarted_after_kill,
)

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

MALFORMED = b"{not json"


class Offsets:
    """Per partition of a topic, the high watermark (read_uncommitted) and the last stable
    offset (read_committed: below the first record of a transaction still open), from two
    consumers kept open (asked every few milliseconds while a kill is timed)."""

    def __init__(self, bootstrap: str, topic: str):
        self.consumers = {
            isolation: KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
            for isolation in ("read_uncommitted", "read_committed")
        }
        consumer = self.consumers["read_committed"]
        self.partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]

    def end(self, isolation: str) -> dict[int, int]:
        found = self.consumers[isolation].end_offsets(self.partitions)
        return {tp.partition: offset for tp, offset in found.items()}

    def transaction_open(self) -> bool:
        high, stable = self.end("read_uncommitted"), self.end("read_committed")
        return any(high[p] > stable[p] for p in high)

    def close(self) -> None:
        for consumer in self.consumers.values():
            consumer.close()


def end_offsets(bootstrap: str, topic: str, isolation: str) -> dict[int, int]:
    offsets = Offsets(bootstrap, topic)
    try:
        return offsets.end(isolation)
    finally:
        offsets.close()


def test_kafka_and_postgres_sinks_survive_kill_9_inside_open_transactions_exactly_once(
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    job_dirs,  # noqa: F811
):
    source, out, dead = (new_topic(kafka_bootstrap) for _ in range(3))
    table = f"k2k_{out.replace('-', '_')}"
    body = {
        "source": {
            "connection": "events",
            "topics": [source],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
            "max_records_per_batch": 10000,
        },
        "sinks": [
            {
                "kind": "kafka",
                "connection": "events",
                "topic": out,
                "dead_letter_topic": dead,
                "key": "id",
            },
            {"connection": "warehouse", "table": table},
        ],
        "trigger": {"interval_seconds": 0},
        "restart_policy": {"kind": "fixed-delay", "attempts": 6, "delay_seconds": 1},
    }
    response = api.post("/api/pipelines/", {"name": "k2k", "spec": body}, format="json")
    assert response.status_code == 201, response.json()
    produced = 0

    def produce_more(n: int) -> None:
        nonlocal produced
        produce(
            kafka_bootstrap,
            source,
            ({"id": f"r{i}", "n": i} for i in range(produced, produced + n)),
            start=produced,
        )
        produce(kafka_bootstrap, source, [MALFORMED])
        produced += n

    def output_count() -> int:
        stable = end_offsets(kafka_bootstrap, out, "read_committed")
        return sum(stable.values())  # an upper bound of what read_committed sees

    def caught_up() -> bool:
        """The checkpoint committed every source record (after the sink's transactions)."""
        found = read_checkpoint(Path(job_dirs) / "checkpoints" / "k2k", sizes=False)
        committed = sum(found.committed_offsets().values()) if found else 0
        return committed == sum(end_offsets(kafka_bootstrap, source, "read_committed").values())

    produce_more(5000)
    api.post("/api/pipelines/k2k/start/")
    reconcile_until("k2k", lambda: output_count() >= 5000, 180, "the first records")
    killed_inside = 0
    output = Offsets(kafka_bootstrap, out)
    for kill in range(2):
        produce_more(60000)  # several batches in flight when the driver dies
        run = Run.objects.get(pipeline__name="k2k", state=RunState.RUNNING)
        driver = driver_pid(run)
        deadline = time.monotonic() + 60
        while not output.transaction_open() and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(driver, signal.SIGKILL)
        time.sleep(1)
        # The dead driver's transaction stays open (nothing can commit it any more) until its
        # successor takes over the transactional id and aborts it.
        killed_inside += output.transaction_open()
        restarted_after_kill("k2k", run, f"the restart after kill {kill}")
    output.close()
    assert killed_inside >= 1, "the driver was never killed inside an open transaction"
    reconcile_until("k2k", caught_up, 240, "the end")
    records = read_committed(kafka_bootstrap, out)
    ids = [json.loads(v)["id"] for _, v, _ in records]
    assert len(ids) == produced and set(ids) == {f"r{i}" for i in range(produced)}
    assert all(k == json.loads(v)["id"].encode() for k, v, _ in records[:100])
    letters = read_committed(kafka_bootstrap, dead)
    assert [v for _, v, _ in letters] == [MALFORMED] * 3
    with psycopg.connect(sink_dsn) as conn:  # the second sink, exactly once too
        found = conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"').fetchone()
    assert found == (produced, produced)
    pipeline = Pipeline.objects.get(name="k2k")
    assert (pipeline.restarts, pipeline.failures.count()) == (2, 2)
    api.post("/api/pipelines/k2k/stop/")
    reconcile_until(
        "k2k", lambda: Pipeline.objects.get(name="k2k").status == "stopped", 120, "stop"
    )
