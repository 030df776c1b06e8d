"""Producing test data into the real broker (Apache Kafka in development)."""

from __future__ import annotations

import json
import threading
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

# Topics this test session created: deleted when it ends (conftest), so a development
# broker, whose log is kept on disk, does not collect every run's topics.
CREATED: set[str] = set()


def new_topic(bootstrap: str, partitions: int = 3, prefix: str = "t") -> str:
    """A fresh topic per test: the broker keeps its log on disk across runs, so tests never
    share one (nor see an earlier run's records)."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    CREATED.add(name)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()
    return name


def produce(
    bootstrap: str, topic: str, values, partitions: int = 3, start: int = 0, timestamp=None
) -> int:
    """Send each value (dict -> JSON, bytes as is) round-robin over partitions; returns count.
    `timestamp(i)`, if given, stamps record i (epoch ms)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    n = 0
    try:
        for i, value in enumerate(values, start=start):
            payload = value if isinstance(value, bytes) else json.dumps(value).encode()
            producer.send(
                topic,
                key=str(i).encode(),
                value=payload,
                partition=i % partitions,
                timestamp_ms=timestamp(i) if timestamp else None,
            )
            n += 1
        producer.flush()
    finally:
        producer.close()
    return n


def read_committed(bootstrap, topic, *, isolation="read_committed"):
    """Every record of `topic` a read_committed consumer sees: (key, value, headers)."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        return [(r.key, r.value, dict(r.headers)) for r in consumer]
    finally:
        consumer.close()


class Load:
    """Records with unique ids into the topic at about `rate` a second, until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate: float = 200) -> None:
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
        self.topic, self.rate, self.sent = topic, rate, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            for _ in range(int(self.rate / 10)):
                payload = json.dumps({"id": f"e{self.sent}", "n": self.sent}).encode()
                self.producer.send(self.topic, value=payload, partition=self.sent % 3)
                self.sent += 1
            self._stop.wait(max(0.0, 0.1 - (time.monotonic() - started)))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        self.producer.flush()
        self.producer.close()
        return self.sent


def delete_created_topics(bootstrap: str) -> None:
    """Delete the topics this session created (best-effort)."""
    if not CREATED:
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        doomed = sorted(CREATED & existing)
        for i in range(0, len(doomed), 100):
            admin.delete_topics(doomed[i : i + 100])
    finally:
        admin.close()
    CREATED.clear()
