"""A load generator of courier delivery events, for the demo and the benchmarks.

    python -m jobs.loadgen --bootstrap 127.0.0.1:59092 --topic deliveries --rate 200

Each event is ~200 bytes of JSON: delivery id, courier id, status, coordinates, event time. A
configurable share of records is malformed (truncated JSON, wrong types, binary junk), so the
dead-letter path is exercised too. Deliveries move through their statuses, so an upsert sink
keyed by delivery_id shows each delivery's latest state.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime

STATUSES = ["created", "assigned", "picked_up", "in_transit", "delivered"]
MALFORMED = [
    lambda e: json.dumps(e)[: len(json.dumps(e)) // 2].encode(),  # truncated
    lambda e: json.dumps({**e, "lat": "north-ish"}).encode(),  # wrong type
    lambda e: b"\x00\xff junk \xfe",  # not text at all
    lambda e: b"[]",  # JSON, but not an object
]


def events(seed: int = 7, deliveries: int = 10_000) -> Iterator[dict]:
    """An endless stream of plausible delivery status changes."""
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    progress: dict[int, int] = {}
    while True:
        d = rng.randrange(deliveries)
        step = progress.get(d, -1) + 1
        if step >= len(STATUSES):
            step = 0  # a new delivery reuses the id slot
        progress[d] = step
        yield {
            "delivery_id": f"D{d:07d}",
            "courier_id": f"C{d % 997:04d}",
            "status": STATUSES[step],
            "lat": round(55.70 + rng.random() * 0.1, 6),
            "lon": round(37.50 + rng.random() * 0.2, 6),
            "event_time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "note": "ok" if rng.random() > 0.1 else "customer asked to call before arrival",
        }


def encoded(malformed_share: float, seed: int = 7) -> Iterator[bytes]:
    rng = random.Random(seed + 1)  # noqa: S311 - test data, not secrets
    for event in events(seed):
        if malformed_share and rng.random() < malformed_share:
            yield rng.choice(MALFORMED)(event)
        else:
            yield json.dumps(event, separators=(",", ":")).encode()


def ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def produce(
    bootstrap: str,
    topic: str,
    *,
    rate: float,
    count: int | None = None,
    malformed_share: float = 0.0,
    partitions: int = 3,
) -> int:
    """Send events at about `rate` per second (0: as fast as possible); returns how many."""
    from kafka import KafkaProducer

    ensure_topic(bootstrap, topic, partitions)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024, acks=1
    )
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sent = 0
    started = time.monotonic()
    try:
        for value in encoded(malformed_share):
            if stopping or (count is not None and sent >= count):
                break
            producer.send(topic, value=value, partition=sent % partitions)
            sent += 1
            if rate and sent % max(1, int(rate / 20)) == 0:
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        producer.flush()
    finally:
        producer.close()
    return sent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="deliveries")
    parser.add_argument("--rate", type=float, default=200.0, help="events per second; 0: max")
    parser.add_argument("--count", type=int, default=None, help="stop after this many")
    parser.add_argument("--malformed", type=float, default=0.01, help="share of bad records")
    parser.add_argument("--partitions", type=int, default=3)
    args = parser.parse_args(argv)
    sent = produce(
        args.bootstrap,
        args.topic,
        rate=args.rate,
        count=args.count,
        malformed_share=args.malformed,
        partitions=args.partitions,
    )
    print(f"sent {sent} events to {args.topic}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
