"""Mirroring a query's committed offsets into a Kafka consumer group, for existing lag tools.

Spark keeps a query's offsets in its checkpoint, which Kafka tools cannot see. With the
spec's `source.consumer_group`, the end offsets of every committed batch are also committed
to that consumer group (OffsetCommit, no group membership: partitions are assigned, never
subscribed), so Burrow, kafka-consumer-groups.sh or a Prometheus exporter show the job's lag.

The offsets come from each batch's progress (`mirror`, a callback of
`jobs.reporting.ProgressPoller`), which Spark records once the batch is in the commit log (a
source's own commit() hears of a batch only when the next one is planned, so it would lag a
batch behind while the topic is quiet), whichever reader the pipeline uses.
Best-effort and off the batch's path: a background thread commits the newest offsets it was
given (older ones not yet sent are skipped); a failure is logged and retried with the next
batch, never raised into the query. The checkpoint stays the source of truth.
"""

from __future__ import annotations

import json
import logging
import threading

from .offsets import flatten

log = logging.getLogger("jobs.kafka")

COMMIT_TIMEOUT_MS = 10_000


class GroupCommitter:
    def __init__(self, client_config: dict, group: str):
        self.client_config = client_config
        self.group = group
        self.committed: dict[tuple[str, int], int] = {}  # what the group holds, as far as known
        self.failures = 0
        self._pending: dict[tuple[str, int], int] | None = None
        self._cond = threading.Condition()
        self._closed = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="cp-group-commit", daemon=True)
        self._thread.start()

    def offer(self, offsets: dict[tuple[str, int], int]) -> None:
        """Commit these offsets soon; never blocks."""
        with self._cond:
            self._pending = dict(offsets)
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is pending (for at most `timeout` seconds), then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            self._cond.wait_for(lambda: self._pending is None and not self._busy, timeout)
        self._thread.join(0.1)

    def _loop(self) -> None:
        consumer = None
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._pending is not None or self._closed)
                    if self._pending is None:
                        return
                    offsets, self._pending, self._busy = self._pending, None, True
                try:
                    if consumer is None:
                        consumer = self._consumer()
                    self._commit(consumer, offsets)
                    self.committed.update(offsets)
                except Exception as exc:
                    self.failures += 1
                    log.warning("offsets not mirrored to consumer group %r: %s", self.group, exc)
                    if consumer is not None:
                        consumer.close()
                        consumer = None
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            if consumer is not None:
                consumer.close()

    def _consumer(self):
        from kafka import KafkaConsumer

        return KafkaConsumer(
            **self.client_config,
            group_id=self.group,
            enable_auto_commit=False,
            request_timeout_ms=COMMIT_TIMEOUT_MS,
        )

    @staticmethod
    def _commit(consumer, offsets: dict[tuple[str, int], int]) -> None:
        from kafka import TopicPartition
        from kafka.structs import OffsetAndMetadata

        consumer.commit(
            {
                TopicPartition(topic, partition): OffsetAndMetadata(offset, "", -1)
                for (topic, partition), offset in offsets.items()
            },
            timeout_ms=COMMIT_TIMEOUT_MS,
        )


def mirror(committer: GroupCommitter, query_name: str | None = None):
    """A progress callback (`jobs.reporting.ProgressPoller`) that hands each batch's end
    offsets of the query named `query_name` (any query's, if None) to `committer`."""

    def offer(progress: dict) -> None:
        if query_name is not None and progress.get("name") != query_name:
            return  # another query
        sources = progress.get("sources") or []
        end = sources[0].get("endOffset") if sources else None
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and progress.get("numInputRows"):
            committer.offer(flatten(end))

    return offer
