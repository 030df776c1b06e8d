"""The Python reader keeps reading when a broker answers its short fetches empty although the
records exist: its fetch wait adapts (10 ms, doubling up to 500 ms, back to 10 ms once records
come). Pure logic of the read loop, with a consumer that behaves like such a broker."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jobs.kafka import source
from jobs.kafka.offsets import Range


class ShortFetchesComeBackEmpty:
    """A consumer whose broker holds the records but answers every fetch allowed to wait less
    than `needs_ms` empty (as Tansu did under load with fetch_max_wait_ms=10)."""

    def __init__(self, records: int, needs_ms: int) -> None:
        self._fetcher = SimpleNamespace(config={"fetch_max_wait_ms": 10})
        self.records, self.needs_ms, self.pos, self.waits = records, needs_ms, 0, []

    def assign(self, partitions) -> None:
        self.tp = partitions[0]

    def seek(self, tp, offset: int) -> None:
        self.pos = offset

    def position(self, tp) -> int:
        return self.pos

    def poll(self, timeout_ms: int, max_records: int) -> dict:
        wait = self._fetcher.config["fetch_max_wait_ms"]
        self.waits.append(wait)
        if wait < self.needs_ms or self.pos >= self.records:
            return {}
        batch = [
            SimpleNamespace(offset=o, timestamp=1_700_000_000_000, key=b"k", value=b"v")
            for o in range(self.pos, min(self.pos + 7, self.records))
        ]
        self.pos = batch[-1].offset + 1
        return {self.tp: batch}

    def end_offsets(self, partitions) -> dict:
        return {p: self.records for p in partitions}


def read(consumer, monkeypatch, records: int) -> int:
    monkeypatch.setattr(source, "_worker_consumer", lambda config: (consumer, False))
    partition = source.KafkaRangePartition(Range("t", 0, 0, records), {}, True, 3_000)
    return sum(batch.num_rows for batch in source.read_range(partition))


def test_reads_on_when_short_fetches_come_back_empty(monkeypatch):
    consumer = ShortFetchesComeBackEmpty(records=50, needs_ms=100)
    assert read(consumer, monkeypatch, 50) == 50
    assert max(consumer.waits) == 160  # 10, 20, 40, 80, 160: the first wait that was enough
    assert consumer._fetcher.config["fetch_max_wait_ms"] == 10  # back to short for the next


def test_a_broker_that_answers_short_fetches_reads_with_the_short_wait(monkeypatch):
    consumer = ShortFetchesComeBackEmpty(records=50, needs_ms=0)
    assert read(consumer, monkeypatch, 50) == 50
    assert set(consumer.waits) == {10}


def test_the_wait_never_grows_past_kafkas_default(monkeypatch):
    consumer = ShortFetchesComeBackEmpty(records=5, needs_ms=10_000)  # never enough
    with pytest.raises(TimeoutError, match="no records for 3000 ms"):
        read(consumer, monkeypatch, 5)
    assert max(consumer.waits) == 500
