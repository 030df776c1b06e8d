"""Kafka metadata for both sides: log bounds, single records, and the consumer that asks.

Used by the Python reader (jobs.kafka.source) inside Spark and by the control plane's lag
lookups (controlplane.observability.kafka_lookups); it needs kafka-python only, not Spark.
"""

from __future__ import annotations

import time

from .auth import check_sasl_login

# How long a trigger may spend confirming log ends before trusting ListOffsets alone.
END_OFFSET_CHECK_SECONDS = 2.0
# How long reading one record (for its timestamp) may take before it counts as a failure.
RECORD_READ_SECONDS = 10.0


def log_bounds(consumer, partitions) -> tuple[dict, dict]:
    """First offsets and log end offsets of (topic, partition) pairs, the ends confirmed by a
    fetch's high watermark.

    On Apache Kafka, ListOffsets(latest) is the high watermark itself, and the check below
    only confirms it. Some Kafka-compatible brokers under-report it (missing the tail of the
    last record batch), which would leave records unread until more arrive; the high watermark
    a fetch returns is authoritative, so one small fetch at the reported end checks it (the
    larger of the two wins). `consumer` is assigned the partitions (a metadata consumer with a
    small max_partition_fetch_bytes, not one that reads data).
    """
    from kafka import TopicPartition

    tps = [TopicPartition(t, p) for t, p in partitions]
    listed = consumer.end_offsets(tps)
    first = consumer.beginning_offsets(tps)
    consumer.assign(tps)
    # Fetch from one record before the listed end: the answer then always carries records,
    # and with them a fresh high watermark for that partition.
    waiting = set()
    for tp in tps:
        consumer.seek(tp, max(first[tp], listed[tp] - 1))
        if listed[tp] > first[tp]:
            waiting.add(tp)
    out = {(tp.topic, tp.partition): listed[tp] for tp in tps}
    deadline = time.monotonic() + END_OFFSET_CHECK_SECONDS
    while waiting and time.monotonic() < deadline:
        for tp in consumer.poll(timeout_ms=50, update_offsets=False):
            waiting.discard(tp)
    for tp in tps:
        hw = consumer.highwater(tp)
        if hw is not None and tp not in waiting:
            out[(tp.topic, tp.partition)] = max(listed[tp], hw)
    return {(tp.topic, tp.partition): o for tp, o in first.items()}, out


def metadata_consumer(client_config: dict):
    """A consumer for offsets and single records, never for bulk reading. A SASL login the
    cluster refuses raises SaslLoginError at once (kafka-python would retry until its
    bootstrap timeout and then report only that)."""
    from kafka import KafkaConsumer

    check_sasl_login(client_config)
    return KafkaConsumer(
        **client_config,
        enable_auto_commit=False,
        max_partition_fetch_bytes=1024,
        fetch_max_wait_ms=10,
    )


def record_time(consumer, tp, offset: int, end: int) -> tuple[int, int] | None:
    """The first record at or after `offset` (before `end`): its offset and timestamp; None
    when there is none (what lies between is control records or compacted away).

    Raises TimeoutError when the broker did not say within RECORD_READ_SECONDS: an unknown
    is never taken for an absence (a search by time would then start after records it never
    saw)."""
    consumer.assign([tp])
    consumer.seek(tp, offset)
    deadline = time.monotonic() + RECORD_READ_SECONDS
    while time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=100, max_records=50, update_offsets=False).get(
            tp, []
        ):
            if offset <= record.offset < end:
                return record.offset, record.timestamp
            if record.offset >= end:
                return None
        # A fetch that returned no record moves the position past what it skipped (control
        # batches): past `end`, the range holds no record.
        if consumer.position(tp) >= end:
            return None
    raise TimeoutError(
        f"{tp.topic}[{tp.partition}]: the record at offset {offset} was not read within"
        f" {RECORD_READ_SECONDS:g} s"
    )


def record_prefixes(
    consumer, ranges: dict, *, prefix_bytes: int, seconds: float = RECORD_READ_SECONDS
) -> dict:
    """The first `prefix_bytes` of each record's value in each partition's offset range
    ({TopicPartition: (start, end)}: records at start <= offset < end), oldest first (None
    for a record without a value), and the offset it was read up to: {TopicPartition:
    (prefixes, reached)}; never before a log's start. Reads for at most `seconds`: a
    partition whose range was not read to its end in that time has what was read (a sample,
    never a failure)."""
    prefixes: dict = {tp: [] for tp in ranges}
    waiting = {tp for tp, (start, end) in ranges.items() if start < end}
    if waiting:
        # Never before the log's start (retention deleted what lay there): a seek there
        # would jump to the consumer's reset position, not to the first record.
        first = consumer.beginning_offsets(list(waiting))
        ranges = {
            tp: (max(start, first.get(tp, start)), end) if tp in waiting else (start, end)
            for tp, (start, end) in ranges.items()
        }
        waiting = {tp for tp in waiting if ranges[tp][0] < ranges[tp][1]}
    reached = {tp: start for tp, (start, _) in ranges.items()}
    if waiting:
        consumer.assign(list(waiting))
        for tp in waiting:
            consumer.seek(tp, ranges[tp][0])
    deadline = time.monotonic() + seconds
    while waiting and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=100, max_records=500).items():
            if tp not in waiting:
                continue
            start, end = ranges[tp]
            for record in records:
                if start <= record.offset < end:
                    value = record.value
                    prefixes[tp].append(None if value is None else bytes(value[:prefix_bytes]))
                    reached[tp] = record.offset + 1
        for tp in list(waiting):
            # Past what it skipped too (control batches, compacted records): at its end,
            # the range is read.
            if consumer.position(tp) >= ranges[tp][1]:
                reached[tp] = ranges[tp][1]
                waiting.discard(tp)
    return {tp: (prefixes[tp], min(reached[tp], ranges[tp][1])) for tp in ranges}
