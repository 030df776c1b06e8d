"""The numpy record-batch decoder gives exactly what kafka-python's own record path gives."""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import calc_crc32c

from jobs.kafka import arrowfetch
from jobs.kafka.arrowfetch import Chunk
from tests.kafka_helpers import new_topic
from tests.waiting import wait_for

TP = TopicPartition("t", 0)
GZIP = 1


def build(batches, magic=2, compression=0) -> bytes:
    """Record batches, one per list of (timestamp, key, value, headers), offsets consecutive."""
    out = bytearray()
    offset = 0
    for records in batches:
        builder = MemoryRecordsBuilder(magic, compression, batch_size=1 << 30, offset=offset)
        for ts, key, value, headers in records:
            builder.append(ts, key, value, headers if magic == 2 else None)
        builder.close()
        out += builder.records()._buffer
        offset += len(records)
    return bytes(out)


def reference(buffer: bytes, fetch_offset=0, **kw) -> list[tuple]:
    part = Fetcher.PartitionRecords(fetch_offset, TP, MemoryRecords(buffer), **kw)
    return [(r.key, r.value, r.offset, r.timestamp) for r in part.take()]


def arrow(buffer: bytes, fetch_offset=0, **kw) -> tuple[list[tuple], int, list[Chunk]]:
    cls = arrowfetch._arrow_partition_records(Fetcher.PartitionRecords)
    part = cls(fetch_offset, TP, MemoryRecords(buffer), **kw)
    chunks = part.take()
    assert all(isinstance(c, Chunk) for c in chunks)
    rows = [
        (k, v, int(o), int(t))
        for c in chunks
        for k, v, o, t in zip(
            c.keys.to_pylist(), c.values.to_pylist(), c.offsets, c.timestamps, strict=True
        )
    ]
    return rows, part.next_fetch_offset, chunks


record = st.tuples(
    st.integers(min_value=0, max_value=2**42),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=300), st.binary(min_size=16_000, max_size=17_000)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=20))), max_size=3
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.lists(record, min_size=1, max_size=30), min_size=1, max_size=4),
    compression=st.sampled_from([0, GZIP]),
    data=st.data(),
)
def test_decoded_batches_equal_kafka_python_records(batches, compression, data):
    buffer = build(batches, compression=compression)
    total = sum(len(b) for b in batches)
    fetch_offset = data.draw(st.integers(min_value=0, max_value=total - 1))
    rows, next_offset, _ = arrow(buffer, fetch_offset)
    assert rows == reference(buffer, fetch_offset)
    assert next_offset == total


def test_varints_of_every_width_decode():
    sizes = [0, 1, 63, 64, 127, 128, 8191, 8192, 1_048_575, 1_048_576]
    records = [(2**40 + s, b"k" * (s % 50), b"v" * s, []) for s in sizes]
    buffer = build([records])
    rows, _, _ = arrow(buffer)
    assert rows == reference(buffer)
    assert [len(v) for _, v, _, _ in rows] == sizes


def test_legacy_message_format_goes_through_kafka_python():
    batches = [[(1_700_000_000_000 + i, None, b"x%d" % i, None) for i in range(5)]]
    for magic in (0, 1):
        buffer = build(batches, magic=magic)
        rows, next_offset, _ = arrow(buffer)
        assert [(k, v, o) for k, v, o, _ in rows] == [(k, v, o) for k, v, o, _ in reference(buffer)]
        assert next_offset == 5


def _control(buffer: bytes) -> bytes:
    """The same batch marked as a transaction control batch (attributes bit 5), CRC redone."""
    data = bytearray(buffer)
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | 0x20 | 0x10)
    struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def test_control_batches_are_skipped_but_counted_in_the_position():
    data = build([[(1, None, b"a", [])], [(2, None, b"b", [])]])
    first_len = struct.unpack_from(">i", data, 8)[0] + 12
    marker = build([[(3, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])]])
    marker = bytearray(_control(marker))
    struct.pack_into(">q", marker, 0, 2)  # base offset 2: after both records
    buffer = data[:first_len] + data[first_len:] + bytes(marker)
    rows, next_offset, _ = arrow(buffer)
    assert [v for _, v, _, _ in rows] == [b"a", b"b"]
    assert next_offset == 3


def test_a_corrupt_batch_raises_instead_of_returning_garbage():
    buffer = bytearray(build([[(1, b"key", b"value-" * 10, [])] * 3]))
    buffer[-40] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        arrow(bytes(buffer))
    # Even unchecked, a length that runs past its record is caught by the decoder.
    lying = bytearray(build([[(1, None, b"v" * 10, [])] * 2]))
    lying[61 + 4] = 0x7E  # first record's value length: 63 (> the record)
    with pytest.raises(CorruptRecordError):
        arrow(bytes(lying), check_crcs=False)


def test_chunks_keep_null_keys_and_values_apart_from_empty_ones():
    buffer = build([[(5, None, None, []), (6, b"", b"", []), (7, b"k", b"v", [])]])
    rows, _, chunks = arrow(buffer)
    assert rows == [(None, None, 0, 5), (b"", b"", 1, 6), (b"k", b"v", 2, 7)]
    assert chunks[0].keys.null_count == 1 and chunks[0].values.null_count == 1


@pytest.fixture
def topic(kafka_bootstrap):
    return new_topic(kafka_bootstrap, partitions=1, prefix="arrowfetch")


def test_a_real_consumer_returns_chunks_from_the_broker(kafka_bootstrap, topic):
    # A recent time: the broker deletes records stamped beyond its 7-day retention.
    stamp = (int(time.time()) - 60) * 1000
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type="gzip")
    sent = [(b"k%d" % i if i % 3 else None, b'{"n": %d}' % i) for i in range(2_000)]
    for key, value in sent:
        producer.send(topic, key=key, value=value, partition=0, timestamp_ms=stamp)
    producer.flush()
    producer.close()

    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, fetch_max_wait_ms=10)
    assert arrowfetch.install(consumer)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 700)
    got: list[Chunk] = []

    def read_from_700() -> bool:
        got.extend(consumer.poll(timeout_ms=1000).get(tp, []))
        return sum(len(c) for c in got) >= len(sent) - 700

    wait_for(read_from_700, 60, every=0)  # each poll waits up to 1 s for records
    consumer.close()
    assert all(isinstance(c, Chunk) for c in got)
    offsets = np.concatenate([c.offsets for c in got])
    assert offsets.tolist() == list(range(700, 2_000))
    keys = [k for c in got for k in c.keys.to_pylist()]
    values = [v for c in got for v in c.values.to_pylist()]
    assert list(zip(keys, values, strict=True)) == sent[700:]
    assert {int(t) for c in got for t in c.timestamps} == {stamp}
