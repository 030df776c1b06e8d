"""jobs.reporting.ProgressPoller: a query's progress read from the query, each batch once."""

from __future__ import annotations

import json

import pytest

from jobs.reporting import ProgressPoller
from tests.waiting import wait_for


class FakeProgress:
    """What py4j hands back for a StreamingQueryProgress."""

    def __init__(self, batch: int, stamp: str):
        self.batch, self.stamp = batch, stamp

    def batchId(self):
        return self.batch

    def timestamp(self):
        return self.stamp

    def json(self):
        return json.dumps({"batchId": self.batch, "timestamp": self.stamp, "name": "q"})


class FakeStatus:
    def __init__(self, trigger_active: bool, data_available: bool):
        self.trigger, self.data = trigger_active, data_available

    def isTriggerActive(self):
        return self.trigger

    def isDataAvailable(self):
        return self.data


class FakeQuery:
    """A StreamingQuery's JVM side as the poller uses it: the last `keep` progress updates."""

    def __init__(self, keep: int = 5):
        self.keep = keep
        self.progress: list[FakeProgress] = []
        self.state = FakeStatus(True, True)
        self.recent_reads = 0
        self._jsq = self

    def batch(self, batch: int) -> None:
        self.progress = [*self.progress, FakeProgress(batch, f"2026-11-23T08:00:{batch:02d}.000Z")]
        self.progress = self.progress[-self.keep :]

    def lastProgress(self):
        return self.progress[-1] if self.progress else None

    def recentProgress(self):
        self.recent_reads += 1
        return list(self.progress)

    def status(self):
        return self.state


def test_each_batch_is_handed_on_once_in_order_even_several_between_polls():
    query, seen = FakeQuery(), []
    poller = ProgressPoller(query, [lambda p: seen.append(p["batchId"])])
    assert poller.poll() == 0  # no batch yet
    query.batch(0)
    query.batch(1)
    assert poller.poll() == 2  # the first read takes all that are kept
    assert poller.poll() == 0
    query.batch(2)
    assert poller.poll() == 1
    reads = query.recent_reads
    assert reads == 1  # the next batch alone comes from lastProgress
    for batch in (3, 4, 5):
        query.batch(batch)
    assert poller.poll() == 3
    assert query.recent_reads == reads + 1
    assert seen == [0, 1, 2, 3, 4, 5]


def test_a_progress_of_the_same_batch_with_a_later_time_is_new():
    query, seen = FakeQuery(), []
    poller = ProgressPoller(query, [lambda p: seen.append((p["batchId"], p["timestamp"]))])
    query.batch(7)
    poller.poll()
    query.progress.append(FakeProgress(7, "2026-11-23T08:01:00.000Z"))
    assert poller.poll() == 1
    assert [b for b, _ in seen] == [7, 7]


def test_idle_is_reported_only_while_no_trigger_runs_and_no_data_waits_at_most_so_often():
    query, idles = FakeQuery(), []
    poller = ProgressPoller(query, [], lambda: idles.append(1), idle_seconds=5.0)
    poller.poll(now=100.0)
    assert idles == []  # a trigger is running
    query.state = FakeStatus(False, True)
    poller.poll(now=101.0)
    assert idles == []  # data is waiting: the next trigger takes it
    query.state = FakeStatus(False, False)
    poller.poll(now=102.0)
    poller.poll(now=104.0)
    assert idles == [1]
    poller.poll(now=107.5)
    assert idles == [1, 1]


def test_a_failing_callback_does_not_keep_the_others_from_the_batch_and_poll_never_raises():
    query, seen = FakeQuery(), []

    def broken(progress):
        raise ValueError("no")

    poller = ProgressPoller(query, [broken, lambda p: seen.append(p["batchId"])])
    query.batch(0)
    assert poller.poll() == 1
    assert seen == [0]

    def gone():
        raise RuntimeError("py4j: the JVM is gone")

    query.lastProgress = gone
    assert poller.poll() == 0


@pytest.mark.timeout(120)
def test_a_real_query_s_batches_each_reach_the_callbacks_once_and_an_empty_source_is_idle(
    spark, tmp_path
):
    seen = []
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 10)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "rate"))
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        poller = ProgressPoller(query, [lambda p: seen.append(p["batchId"])])

        def thirty_seen() -> bool:
            poller.poll()  # hands on the batches done since the last poll
            return len(seen) >= 30

        wait_for(thirty_seen, 60, every=0.2)
    finally:
        query.stop()
    poller.poll()  # and once more after the end, as jobs.run.wait does
    assert len(seen) >= 30
    assert seen == list(range(seen[0], seen[0] + len(seen)))  # every batch, once, in order

    (tmp_path / "in").mkdir()
    idles = []
    empty = (
        spark.readStream.schema("id INT")
        .json(str(tmp_path / "in"))
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "empty"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        poller = ProgressPoller(empty, [], lambda: idles.append(1), idle_seconds=0.5)

        def idle() -> bool:
            poller.poll()
            return bool(idles)

        wait_for(idle, 30, every=0.2)
    finally:
        empty.stop()
    assert idles
