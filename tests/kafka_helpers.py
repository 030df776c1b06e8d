"""Producing test data into the real broker (Apache Kafka in development)."""

from __future__ import annotations

import json
import uuid

from kafka import KafkaProducer
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
