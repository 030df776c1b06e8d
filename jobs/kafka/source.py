"""A Kafka streaming source for PySpark's Python Data Source API, on kafka-python.

Spark's own Kafka connector is a JVM jar that cannot be installed everywhere; this source
needs only Python. It keeps Kafka offsets in Spark's checkpoint (so a restarted query resumes
exactly where the last committed batch ended), limits batch size through admission control
(`ReadMaxRows`), splits large offset ranges so that every core works, and returns Arrow
record batches. Partition assignment is explicit (`assign`), never consumer-group based.

Registered under the name `cp_kafka` (Spark reserves `kafka`). Options (all strings):

| option | meaning |
| --- | --- |
| `topics` | comma-separated topic names |
| `config_file` | JSON file of kafka-python client arguments (may hold secrets: mode 0600) |
| `bootstrap_servers` | instead of `config_file`, for a cluster without credentials |
| `starting_offsets` | `earliest`, `latest` or JSON `{"t": {"0": 42}}` (-2 earliest, -1 latest) |
| `starting_timestamp` | instead, epoch ms: each partition from its first record at or after it |
| `max_records_per_batch` | admission control: at most this many records per micro-batch |
| `fail_on_data_loss` | `true`: fail when records were deleted before being read |
| `min_partitions` | cut a batch into at least this many input partitions (default 2) |
| `max_split_records` | and none larger than this (default 200000) |
| `poll_timeout_ms` | how long a read may wait for records it knows exist (default 120000) |
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from ..failures import DATA_LOSS_CATEGORY, PermanentError
from . import arrowfetch
from .arrowfetch import Chunk
from .auth import check_sasl_login
from .metadata import log_bounds, metadata_consumer, record_time
from .offsets import PLAN, Offsets, Range, cap, find_losses, flatten, nest, split

log = logging.getLogger("jobs.kafka")

NAME = "cp_kafka"
SCHEMA = "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
ARROW_BATCH_ROWS = 20_000
ARROW_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
EARLIEST, LATEST = -2, -1


class DataLossError(PermanentError, RuntimeError):
    """Records the query should have read were deleted (retention, truncation) first."""

    what = "data loss (fail_on_data_loss is true)"
    category = DATA_LOSS_CATEGORY


class KafkaSourceOptions:
    """The source's options, parsed once, with errors that name the option."""

    def __init__(self, options: dict[str, str]):
        self.topics = [t.strip() for t in options.get("topics", "").split(",") if t.strip()]
        if not self.topics:
            raise ValueError("cp_kafka: option 'topics' is required")
        self.client_config = self._client_config(options)
        self.starting_offsets = options.get("starting_offsets", "latest")
        self.starting_timestamp = _int_option(options, "starting_timestamp", -1)
        self.max_records_per_batch = _int_option(options, "max_records_per_batch", 0) or None
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true").lower() == "true"
        self.min_partitions = _int_option(options, "min_partitions", 2)
        self.max_split_records = _int_option(options, "max_split_records", 200_000)
        self.poll_timeout_ms = _int_option(options, "poll_timeout_ms", 120_000)

    @staticmethod
    def _client_config(options: dict[str, str]) -> dict[str, Any]:
        if options.get("config_file"):
            with open(options["config_file"]) as f:
                return json.load(f)
        if options.get("bootstrap_servers"):
            return {"bootstrap_servers": options["bootstrap_servers"].split(",")}
        raise ValueError("cp_kafka: set option 'config_file' or 'bootstrap_servers'")


def _int_option(options: dict[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"cp_kafka: option {name!r} must be a whole number, got {raw!r}") from None


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> KafkaStreamReader:
        return KafkaStreamReader(KafkaSourceOptions(dict(self.options)))


class KafkaRangePartition(InputPartition):
    """One offset range to read, with what a Python worker needs to read it."""

    def __init__(self, piece: Range, client_config: dict, fail_on_data_loss: bool, timeout: int):
        super().__init__(piece)
        self.range = piece
        self.client_config = client_config
        self.fail_on_data_loss = fail_on_data_loss
        self.poll_timeout_ms = timeout

    def __repr__(self) -> str:  # never print the client config: it may hold secrets
        r = self.range
        return f"KafkaRangePartition({r.topic}-{r.partition} [{r.start}, {r.end}))"


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Runs on the driver, in one long-lived process: its metadata consumer is reused."""

    def __init__(self, options: KafkaSourceOptions):
        self.options = options
        self._consumer = None
        self._lock = threading.Lock()
        self._latest: Offsets | None = None
        # Trigger.AvailableNow: the log ends recorded when the query started; never read past.
        self._target: dict[tuple[str, int], int] | None = None

    def __getstate__(self) -> dict:
        # Spark pickles the reader to ship read() to Python workers: drop the driver's clients.
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"])

    # -- offsets ---------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        starting = self.options.starting_offsets
        partitions = self._partitions()
        if self.options.starting_timestamp >= 0:
            return nest(self._offsets_for_time(partitions, self.options.starting_timestamp))
        if starting in ("earliest", "latest"):
            ends = self._beginning(partitions) if starting == "earliest" else self._end(partitions)
            return nest(ends)
        requested = flatten(json.loads(starting))
        earliest, latest = self._bounds(partitions)
        out = {}
        for tp in partitions:
            wanted = requested.get(tp, EARLIEST)
            out[tp] = {EARLIEST: earliest[tp], LATEST: latest[tp]}.get(wanted, wanted)
        return nest(out)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_batch:
            return ReadMaxRows(self.options.max_records_per_batch)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        partitions = self._partitions()
        begin = flatten(start)
        new = [tp for tp in partitions if tp not in begin]
        first = {}
        if new:
            # Partitions added to a topic are read from their beginning, as Spark does.
            log.info("cp_kafka: new partitions %s", sorted(new))
            first = self._beginning(new)
            begin.update(first)
        earliest, ends = self._bounds(partitions)
        for loss in find_losses(start, earliest, ends):
            if self.options.fail_on_data_loss:
                raise DataLossError(
                    f"{loss}; set fail_on_data_loss to false to resume at the first record"
                    " still there"
                )
            log.warning(
                "cp_kafka data loss (fail_on_data_loss is false): %s; resuming at offset %s",
                loss,
                loss.resume,
            )
            first[(loss.topic, loss.partition)] = begin[(loss.topic, loss.partition)] = loss.resume
        self._latest = nest(ends)
        if self._target is not None:
            ends = {tp: min(o, self._target.get(tp, begin.get(tp, 0))) for tp, o in ends.items()}
        latest = nest(ends)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = cap(nest(begin), latest, max_rows)
        if flatten(end) == flatten(start):
            return start  # nothing new: the very same offsets, so Spark runs no batch
        # How this batch is cut, kept with its offsets: a replay (after a restart, maybe with
        # other options or more cores) reads exactly the same input partitions, which is what
        # per-partition commit markers in a sink rely on.
        end[PLAN] = {
            "min_splits": self.options.min_partitions,
            "max_split_records": self.options.max_split_records,
            "from": nest(first),
        }
        return end

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._end(self._partitions())

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    def partitions(self, start: dict, end: dict) -> list[KafkaRangePartition]:
        begin = flatten(start)
        plan = end.get(PLAN)
        if plan is None:
            # An offset log written before plans were recorded: plan as then.
            plan = {
                "min_splits": self.options.min_partitions,
                "max_split_records": self.options.max_split_records,
            }
            new = [tp for tp in flatten(end) if tp not in begin]
            plan["from"] = nest(self._beginning(new)) if new else {}
        begin.update(flatten(plan["from"]))
        pieces = split(
            nest(begin),
            end,
            min_splits=plan["min_splits"],
            max_split_records=plan["max_split_records"],
        )
        return [
            KafkaRangePartition(
                piece,
                self.options.client_config,
                self.options.fail_on_data_loss,
                self.options.poll_timeout_ms,
            )
            for piece in pieces
        ]

    def read(self, partition: KafkaRangePartition) -> Iterator:
        return read_range(partition)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None

    # -- Kafka metadata ----------------------------------------------------------------------

    def _metadata_consumer(self):
        if self._consumer is None:
            self._consumer = metadata_consumer(self.options.client_config)
        return self._consumer

    def _partitions(self) -> list[tuple[str, int]]:
        with self._lock:
            consumer = self._metadata_consumer()
            out = []
            for topic in self.options.topics:
                found = consumer.partitions_for_topic(topic)
                if not found:
                    # Metadata may lag topic creation: ask once more before saying it is missing.
                    consumer._client.cluster.request_update()
                    consumer._client.poll(timeout_ms=500)
                    found = consumer.partitions_for_topic(topic) or set()
                out += [(topic, p) for p in sorted(found)]
            return out

    def _beginning(self, partitions) -> dict[tuple[str, int], int]:
        from kafka import TopicPartition

        with self._lock:
            result = self._metadata_consumer().beginning_offsets(
                [TopicPartition(t, p) for t, p in partitions]
            )
        return {(tp.topic, tp.partition): o for tp, o in result.items()}

    def _bounds(self, partitions) -> tuple[dict, dict]:
        """(first offsets, confirmed log ends), from one round of requests."""
        if not partitions:
            return {}, {}
        with self._lock:
            return log_bounds(self._metadata_consumer(), partitions)

    def _end(self, partitions) -> dict[tuple[str, int], int]:
        return self._bounds(partitions)[1]

    def _offsets_for_time(self, partitions, ms: int) -> dict[tuple[str, int], int]:
        """Per partition, the first offset whose record is stamped at or after `ms` (the log
        end when every record is older), as Kafka's ListOffsets by timestamp answers.

        The broker's answer is checked against the records around it; where it is wrong
        (some Kafka-compatible brokers keep no time index), the offset is found by a binary
        search over the records' own timestamps. A record that cannot be read in time fails
        the lookup (TimeoutError, the query's start fails and is retried by its policy): an
        unread record taken for a missing one would start the query after it.
        """
        from kafka import TopicPartition

        first, ends = self._bounds(partitions)
        tps = {tp: TopicPartition(*tp) for tp in partitions}
        with self._lock:
            consumer = self._metadata_consumer()
            try:
                answers = consumer.offsets_for_times({tps[tp]: ms for tp in partitions})
            except Exception as exc:  # an old broker, an unsupported request version
                log.info("cp_kafka: offsets_for_times failed (%s); searching the logs", exc)
                answers = {}
            out = {}
            for tp in partitions:
                lo, hi = first[tp], ends[tp]
                answer = answers.get(tps[tp])
                guess = hi if answer is None or answer.offset is None else answer.offset
                if lo <= guess <= hi and self._starts_at(consumer, tps[tp], guess, ms, lo, hi):
                    out[tp] = guess
                else:
                    out[tp] = self._search_time(consumer, tps[tp], ms, lo, hi)
            return out

    def _starts_at(self, consumer, tp, offset: int, ms: int, lo: int, hi: int) -> bool:
        """Whether `offset` is the first record at or after `ms`: it is, or is the end, and
        the record before it is older."""
        if offset < hi:
            found = record_time(consumer, tp, offset, hi)
            if found is None or found[1] < ms:
                return False
        if offset > lo:
            before = record_time(consumer, tp, offset - 1, hi)
            if before is not None and before[0] == offset - 1 and before[1] >= ms:
                return False
        return True

    def _search_time(self, consumer, tp, ms: int, lo: int, hi: int) -> int:
        """Binary search over [lo, hi) for the first record stamped at or after `ms`,
        assuming timestamps grow with offsets (as Kafka's time index does)."""
        while lo < hi:
            mid = (lo + hi) // 2
            found = record_time(consumer, tp, mid, hi)
            if found is None:
                return hi
            offset, stamp = found
            if stamp >= ms:
                hi = mid
            else:
                lo = offset + 1
        return lo


# -- reading, in Python workers -------------------------------------------------------------

_consumers: dict[str, Any] = {}
_consumers_lock = threading.Lock()


def _worker_consumer(client_config: dict):
    """A consumer per client configuration, kept across batches in the reused Python worker,
    and whether it returns Arrow chunks (arrowfetch) rather than ConsumerRecords."""
    from kafka import KafkaConsumer

    key = json.dumps(client_config, sort_keys=True)
    with _consumers_lock:
        entry = _consumers.get(key)
        if entry is None:
            check_sasl_login(client_config)
            consumer = KafkaConsumer(
                **client_config,
                enable_auto_commit=False,
                auto_offset_reset="none",
                # The broker answers as soon as records are there; where there are none (the
                # end of a range), within 10 ms, so a read never idles on the default 500 ms.
                # A broker that answers such short fetches empty gets longer ones (FetchWait).
                fetch_max_wait_ms=FetchWait.FAST_MS,
                max_partition_fetch_bytes=8 * 1024 * 1024,
                fetch_max_bytes=64 * 1024 * 1024,
                max_poll_records=50_000,
            )
            entry = _consumers[key] = (consumer, arrowfetch.install(consumer))
        return entry


def _arrow_batch(r: Range, chunks: list[Chunk]):
    n = sum(len(c) for c in chunks)
    stamps = np.concatenate([c.timestamps for c in chunks])
    arrays = [
        pa.concat_arrays([c.keys for c in chunks]),
        pa.concat_arrays([c.values for c in chunks]),
        pa.array([r.topic] * n, pa.string()),
        pa.array(np.full(n, r.partition, np.int32)),
        pa.array(np.concatenate([c.offsets for c in chunks])),
        pa.array(stamps * 1000, mask=stamps < 0).cast(pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def read_range(partition: KafkaRangePartition) -> Iterator:
    from kafka import TopicPartition

    r = partition.range
    tp = TopicPartition(r.topic, r.partition)
    consumer, chunked = _worker_consumer(partition.client_config)
    consumer.assign([tp])
    consumer.seek(tp, r.start)
    wait = FetchWait(consumer)
    try:
        yield from _read(consumer, chunked, tp, r, partition, wait)
    finally:
        wait.reset()  # the consumer is reused by the next range


class FetchWait:
    """How long the broker may hold a fetch (`fetch_max_wait_ms`) for this consumer.

    Short (10 ms) by default: the records of a range are known to exist, so a short wait only
    matters at the end of the log, where it keeps a read from idling on the default 500 ms.
    But a broker may answer a short fetch empty although the records exist (seen with a
    Kafka-compatible broker under load, and possible on a busy real one): each empty answer
    doubles the wait, up to Kafka's default 500 ms, and records bring it back down.
    """

    FAST_MS = 10
    SLOW_MS = 500

    def __init__(self, consumer) -> None:
        self.config = getattr(getattr(consumer, "_fetcher", None), "config", None)
        self.ms = self.FAST_MS

    def _apply(self, ms: int) -> None:
        self.ms = ms
        if self.config is not None:
            self.config["fetch_max_wait_ms"] = ms

    def empty(self) -> None:
        if self.ms < self.SLOW_MS:
            self._apply(min(self.ms * 2, self.SLOW_MS))

    def reset(self) -> None:
        if self.ms != self.FAST_MS:
            self._apply(self.FAST_MS)


def _read(consumer, chunked, tp, r, partition, wait: FetchWait) -> Iterator:
    from kafka.errors import OffsetOutOfRangeError

    pending: list[Chunk] = []
    rows = 0
    expected = r.start
    deadline = time.monotonic() + partition.poll_timeout_ms / 1000
    while expected < r.end:
        try:
            polled = consumer.poll(timeout_ms=200, max_records=50_000).get(tp, [])
        except OffsetOutOfRangeError:
            polled = []
            expected = _skip_lost(consumer, tp, expected, r, partition.fail_on_data_loss)
            consumer.seek(tp, expected)
            continue
        chunks = polled if chunked or not polled else [Chunk.from_records(polled)]
        for chunk in chunks:
            lo, hi = np.searchsorted(chunk.offsets, [expected, r.end])
            if hi > lo:
                pending.append(chunk.slice(int(lo), int(hi)))
                rows += int(hi - lo)
                expected = int(chunk.offsets[hi - 1]) + 1
            if hi < len(chunk):
                break
        # Control records (transaction markers) and compaction leave gaps: the position, not
        # the last record, says how far the log has been read.
        expected = max(expected, min(consumer.position(tp), r.end))
        if rows >= ARROW_BATCH_ROWS:
            yield _arrow_batch(r, pending)
            pending, rows = [], 0
        if polled:
            deadline = time.monotonic() + partition.poll_timeout_ms / 1000
            wait.reset()
        elif expected < r.end:
            wait.empty()
        if not polled and time.monotonic() > deadline:
            end = consumer.end_offsets([tp])[tp]
            if end < r.end:
                message = (
                    f"{r.topic}-{r.partition}: log ends at {end} but the batch expected "
                    f"records up to {r.end} (truncated or deleted)"
                )
                if partition.fail_on_data_loss:
                    raise DataLossError(message)
                log.warning("cp_kafka data loss (continuing): %s", message)
                break
            raise TimeoutError(
                f"{r.topic}-{r.partition}: no records for {partition.poll_timeout_ms} ms "
                f"at offset {expected} (< {r.end})"
            )
    if pending:
        yield _arrow_batch(r, pending)


def _skip_lost(consumer, tp, expected: int, r: Range, fail: bool) -> int:
    earliest = consumer.beginning_offsets([tp])[tp]
    if earliest <= expected:
        raise DataLossError(f"{r.topic}-{r.partition}: offset {expected} out of range")
    message = (
        f"{r.topic}-{r.partition}: records {expected}..{earliest - 1} were deleted before "
        "they were read (retention?)"
    )
    if fail:
        raise DataLossError(message + "; set fail_on_data_loss=false to skip them")
    log.warning("cp_kafka data loss (continuing): %s", message)
    return earliest
