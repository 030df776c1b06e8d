"""Kafka offsets for the metrics, without a new connection per question.

Opening a Kafka client costs a bootstrap, a metadata round trip and, with SASL, a handshake:
more than the offset lookups themselves. Metadata consumers are pooled per cluster
configuration and reused across requests (each is used by one request at a time). Within one
`KafkaLookups` (one API request, or one Prometheus scrape over every pipeline) the log bounds
of a set of partitions and the time of a record are asked once, so a hundred pipelines
reading one topic cost one lookup per scrape, and the figures of one scrape agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time

from jobs.connections import kafka_client_config
from jobs.kafka.metadata import log_bounds, metadata_consumer, record_time

log = logging.getLogger("controlplane.metrics")

IDLE_PER_CLUSTER = 4
_idle: dict[str, list] = {}
_lock = threading.Lock()
# Topics' retention.ms, per cluster: topic settings change rarely, so asked every 5 minutes.
RETENTION_MAX_AGE = 300.0
_retention: dict[tuple[str, str], tuple[float, int | None]] = {}


def lookup_config(connection) -> dict:
    """The client configuration lookups reach a stored kafka connection with."""
    return {
        **kafka_client_config(connection.settings, connection.get_secrets()),
        # A round must not hang on a dead cluster.
        "bootstrap_timeout_ms": 3_000,
        "request_timeout_ms": 5_000,
        # Pooled consumers: see added partitions within seconds, not minutes.
        "metadata_max_age_ms": 10_000,
    }


def _key(config: dict) -> str:
    # Secrets are part of the identity but never kept in clear text, even in memory keys.
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def acquire(config: dict):
    """A metadata consumer for this configuration: an idle pooled one, or a new one."""
    with _lock:
        idle = _idle.get(_key(config)) or []
        consumer = idle.pop() if idle else None
    return consumer if consumer is not None else metadata_consumer(config)


def release(config: dict, consumer, *, healthy: bool) -> None:
    """Back to the pool after use; closed if the use failed (it may be broken) or the pool
    for this cluster is full."""
    if healthy:
        with _lock:
            idle = _idle.setdefault(_key(config), [])
            if len(idle) < IDLE_PER_CLUSTER:
                idle.append(consumer)
                return
    with contextlib.suppress(Exception):
        consumer.close()


def close_all() -> None:
    with _lock:
        consumers = [c for idle in _idle.values() for c in idle]
        _idle.clear()
    for consumer in consumers:
        with contextlib.suppress(Exception):
            consumer.close()


class KafkaLookups:
    """Offset lookups memoised for the lifetime of this object (one request or scrape)."""

    def __init__(self):
        self._bounds: dict[tuple, tuple[dict, dict]] = {}
        self._times: dict[tuple, tuple[int, int] | None] = {}
        self.broker_lookups = 0  # how many bound lookups went to a broker (for tests)

    def bounds(self, config: dict, consumer, partitions: list[tuple[str, int]]):
        key = (_key(config), tuple(sorted(partitions)))
        if key not in self._bounds:
            self.broker_lookups += 1
            self._bounds[key] = log_bounds(consumer, partitions)
        earliest, ends = self._bounds[key]
        return dict(earliest), dict(ends)

    def record_time(self, config: dict, consumer, tp, offset: int, end: int):
        key = (_key(config), tp.topic, tp.partition, offset, end)
        if key not in self._times:
            self._times[key] = record_time(consumer, tp, offset, end)
        return self._times[key]


def retention_ms(config: dict, topics: list[str]) -> dict[str, int | None]:
    """Each topic's `retention.ms` (None: kept forever, or not known: the broker did not
    say), asked of the cluster at most every RETENTION_MAX_AGE seconds. Never raises."""
    now = time.monotonic()
    key = _key(config)
    out, missing = {}, []
    for topic in topics:
        cached = _retention.get((key, topic))
        if cached is not None and now - cached[0] < RETENTION_MAX_AGE:
            out[topic] = cached[1]
        else:
            missing.append(topic)
    if not missing:
        return out
    try:
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource, ConfigResourceType

        allowed = {k: v for k, v in config.items() if k in KafkaAdminClient.DEFAULT_CONFIG}
        admin = KafkaAdminClient(**allowed)
        try:
            answer = admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, t) for t in missing],
                config_filter="all",
            )
        finally:
            admin.close()
        described = answer.get("topic", {}) if isinstance(answer, dict) else {}
        for topic in missing:
            value = (described.get(topic) or {}).get("retention.ms", {}).get("value")
            ms = int(value) if value not in (None, "") else None
            out[topic] = ms if ms is not None and ms >= 0 else None
            _retention[(key, topic)] = (now, out[topic])
    except Exception as exc:  # a figure we cannot give, not an error of the round
        log.warning("no retention settings from Kafka: %s", exc)
        for topic in missing:
            out[topic] = None
    return out
