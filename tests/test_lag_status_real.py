"""Lag status on real pipelines (controlplane.observability.lag, judged over commits as Burrow
judges consumers): one that keeps up with 200 events/s at a 1 s trigger reads `ok` through a
minute of the collector's samples, although its lag is above zero between its commits; one
whose batches are capped below its input turns `lagging`. Both are members of one real
shared application; the reconciler ticks and the collector samples every two seconds."""

from __future__ import annotations

import threading
import time

import pytest
from django.utils import timezone
from kafka import KafkaProducer

from controlplane.definitions.models import Pipeline, PipelineFigures
from controlplane.observability.collector import collect
from controlplane.supervision import reconciler
from tests.runs import POLICY, current, new_pipeline, tick_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

RATE = 200  # events per second into each topic
SAMPLED = 60  # seconds of samples the status must stay ok through


class Producing(threading.Thread):
    """RATE events per second into each topic, until stopped."""

    def __init__(self, bootstrap: str, topics: list[str]):
        super().__init__(daemon=True)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
        self.topics = topics
        self.stopped = threading.Event()

    def run(self) -> None:
        i = 0
        started = time.monotonic()
        while not self.stopped.is_set():
            for topic in self.topics:
                self.producer.send(topic, value=b'{"id": "e%d", "n": %d}' % (i, i % 1000))
            i += 1
            # Paced on the clock, not by sleeping a fixed step: RATE per second on average.
            ahead = i / RATE - (time.monotonic() - started)
            if ahead > 0:
                self.stopped.wait(ahead)
        self.producer.flush()
        self.producer.close()


def test_a_pipeline_that_keeps_up_stays_ok_and_one_that_falls_behind_turns_lagging(
    api, kafka_connection, postgres_connection, kafka_bootstrap, shared
):
    steady, _ = new_pipeline(api, kafka_bootstrap, "steady", restart_policy=POLICY)
    behind, _ = new_pipeline(
        api,
        kafka_bootstrap,
        "behind",
        source={"max_records_per_batch": 20},  # 20 per 1 s batch: a tenth of its input
        restart_policy=POLICY,
    )
    Pipeline.objects.filter(name__in=["steady", "behind"]).update(placement="shared")
    producing = Producing(kafka_bootstrap, [steady, behind])
    producing.start()
    try:
        for name in ("steady", "behind"):
            assert api.post(f"/api/pipelines/{name}/start/").status_code == 202
        tick_until(
            lambda: all(
                (run := current(n)) is not None and run.last_batch_id is not None
                for n in ("steady", "behind")
            ),
            240,
            "both members' first batches",
        )
        statuses: dict[str, list[tuple[float, int | None, str]]] = {"steady": [], "behind": []}
        began = time.monotonic()
        while time.monotonic() - began < SAMPLED:
            now = timezone.now()
            reconciler.tick(now)
            collect(now)
            for figures in PipelineFigures.objects.filter(pipeline__name__in=list(statuses)):
                statuses[figures.pipeline.name].append(
                    (time.monotonic() - began, figures.lag_records, figures.lag_status)
                )
            time.sleep(2)
    finally:
        producing.stopped.set()
        producing.join(10)
    seen = statuses["steady"]
    assert len(seen) >= 20, seen
    # It had lag between its commits (a saw-tooth), and was never called lagging for it.
    assert any(lag for _, lag, _ in seen), seen
    assert {status for _, _, status in seen} == {"ok"}, seen
    behind_seen = statuses["behind"]
    assert behind_seen[-1][2] == "lagging", behind_seen
    assert behind_seen[-1][1] > behind_seen[0][1], behind_seen
