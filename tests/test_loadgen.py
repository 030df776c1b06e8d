from __future__ import annotations

import json
import uuid

from kafka import KafkaConsumer, TopicPartition

from jobs.loadgen import encoded, produce
from tests.kafka_helpers import CREATED


def test_events_are_about_200_bytes_of_json_with_the_demo_fields():
    values = [v for v, _ in zip(encoded(0.0), range(500), strict=False)]
    events = [json.loads(v) for v in values]
    assert set(events[0]) >= {"delivery_id", "courier_id", "status", "lat", "lon", "event_time"}
    average = sum(map(len, values)) / len(values)
    assert 150 <= average <= 260


def test_the_malformed_share_is_respected():
    values = [v for v, _ in zip(encoded(0.2), range(5000), strict=False)]
    bad = 0
    for value in values:
        try:
            event = json.loads(value)
            ok = isinstance(event, dict) and isinstance(event.get("lat"), float)
        except ValueError:
            ok = False
        bad += not ok
    assert 0.15 < bad / len(values) < 0.25


def test_it_produces_the_requested_count(kafka_bootstrap):
    topic = f"loadgen-{uuid.uuid4().hex[:8]}"
    CREATED.add(topic)  # the load generator creates it; deleted with the session's others
    assert produce(kafka_bootstrap, topic, rate=0, count=300, partitions=3) == 300
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    tps = [TopicPartition(topic, p) for p in range(3)]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    seen = 0
    for _ in range(50):
        seen += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
        if seen >= 300:
            break
    consumer.close()
    assert seen == 300
