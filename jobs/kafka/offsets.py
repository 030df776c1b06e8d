"""Offset arithmetic for the Kafka source: pure functions, no Kafka, no Spark.

Offsets are `{"topic": {"partition": next_offset}}` with string partition keys, the form kept
in Spark's offset log (JSON with primitive values only). Keys starting with `$` are not
topics (Kafka topic names cannot hold `$`): a batch's end offsets also record how the batch
is cut into input partitions (`PLAN`), so a replay of the batch reads the very same pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

Offsets = dict[str, dict[str, int]]

# In a batch's end offsets: {"min_splits": n, "max_split_records": m, "from": {new partitions'
# first offsets}}: everything split() needs besides the two offsets themselves.
PLAN = "$plan"


def flatten(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {
        (t, int(p)): o
        for t, parts in offsets.items()
        if not t.startswith("$")
        for p, o in parts.items()
    }


def nest(flat: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(flat.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def available(start: Offsets, latest: Offsets) -> int:
    """Records between `start` and `latest` (partitions missing from start count from 0)."""
    begin = flatten(start)
    return sum(max(0, end - begin.get(tp, end)) for tp, end in flatten(latest).items())


def cap(start: Offsets, latest: Offsets, max_rows: int | None) -> Offsets:
    """End offsets for the next batch: all of `latest`, or at most `max_rows` records.

    Like Spark's Kafka source, a limited batch takes from each partition in proportion to its
    backlog, so one busy partition cannot starve the others; while the limit allows, every
    partition with a backlog gets at least one record.
    """
    begin = flatten(start)
    end = flatten(latest)
    backlog = {tp: max(0, o - begin.get(tp, o)) for tp, o in end.items()}
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        return nest({tp: max(end[tp], begin.get(tp, end[tp])) for tp in end})
    shares = {tp: lag * max_rows // total for tp, lag in backlog.items()}
    # Rounding down leaves a remainder (never negative): first one record for each partition
    # that got none, then to the largest unread backlogs.
    spare = max_rows - sum(shares.values())
    starved = sorted((tp for tp in backlog if backlog[tp] and not shares[tp]), key=backlog.get)
    for tp in reversed(starved):
        if spare == 0:
            break
        shares[tp] += 1
        spare -= 1
    for tp in sorted(backlog, key=lambda k: backlog[k] - shares[k], reverse=True):
        if spare == 0:
            break
        extra = min(spare, backlog[tp] - shares[tp])
        shares[tp] += extra
        spare -= extra
    return nest({tp: begin.get(tp, end[tp]) + shares[tp] for tp in end})


@dataclass(frozen=True)
class Range:
    """Records [start, end) of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split(start: Offsets, end: Offsets, *, min_splits: int, max_split_records: int) -> list[Range]:
    """Input partitions for a batch: every non-empty range, cut so that there are at least
    `min_splits` pieces (when there are that many records) and none has more than
    `max_split_records`, so all cores work on a backlog of one partition."""
    begin = flatten(start)
    ranges = [
        Range(t, p, begin.get((t, p), o), o)
        for (t, p), o in sorted(flatten(end).items())
        if o > begin.get((t, p), o)
    ]
    total = sum(r.size for r in ranges)
    if total == 0:
        return []
    target = max(1, min(max_split_records, -(-total // max(1, min_splits))))
    out: list[Range] = []
    for r in ranges:
        pieces = max(1, -(-r.size // target))
        step = -(-r.size // pieces)
        for i in range(pieces):
            lo = r.start + i * step
            hi = min(r.end, lo + step)
            if lo < hi:
                out.append(Range(r.topic, r.partition, lo, hi))
    return out


@dataclass(frozen=True)
class Loss:
    """Records a query should have read but cannot: where it was, and where it can resume."""

    topic: str
    partition: int
    position: int  # the next offset the query would have read
    resume: int  # the first offset still there
    reason: str

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}: {self.reason}"


def find_losses(
    start: Offsets, earliest: dict[tuple[str, int], int], latest: dict[tuple[str, int], int]
) -> list[Loss]:
    """Partitions whose unread records are gone: deleted by retention (the log now begins
    after the position), or the log itself was cut back or created again (it ends before
    the position). Either way the query resumes at the log's first record, as Spark does."""
    losses = []
    for (topic, partition), position in sorted(flatten(start).items()):
        tp = (topic, partition)
        if tp not in earliest or tp not in latest:
            continue  # the partition is not there at all (yet): nothing to compare
        first, end = earliest[tp], latest[tp]
        if position < first:
            reason = (
                f"records {position}..{first - 1} were deleted before they were read (retention?)"
            )
        elif position > end:
            reason = (
                f"the log ends at offset {end} but the query had read up to {position}"
                " (the topic was deleted and created again, or truncated): records"
                " written there since may be lost"
            )
        else:
            continue
        losses.append(Loss(topic, partition, position, first, reason))
    return losses


def record_stamps(
    start: dict[tuple[str, int], int],
    end: dict[tuple[str, int], int],
    position: int,
    previous: int | None,
) -> dict[tuple[str, int], int] | None:
    """Per topic-partition of a batch, the number that added to a record's offset gives the
    record a stamp of its own, or None when it cannot be done safely.

    A batch's records are laid out one after another, partition by partition (sorted), each
    at its offset's distance from where its partition starts in the batch, so that the
    batch's stamps lie in (previous, position): above every stamp of the batch before (its
    `previous` position, None for a first batch), below this batch's own `position` (what a
    whole batch is stamped with, jobs.checkpoints.batch_position). A replay of the batch has
    the same offsets and gives the same stamps. `start`: where the batch begins in each of
    its partitions (the end of the batch before, or where the query started), `end`: its
    end offsets (the next offset to read). None if a partition's start is not known or lies
    after its end, or if the layout would reach below `previous` (partitions dropped from
    the source)."""
    lengths = {}
    for tp, stop in end.items():
        if stop < 0:
            continue  # a symbolic offset (earliest/latest): not a position
        first = start.get(tp)
        if first is None or first < 0 or first > stop:
            return None
        lengths[tp] = stop - first
    base = position - 1 - sum(lengths.values())
    if previous is not None and base < previous:
        return None
    out = {}
    before = 0
    for tp in sorted(lengths):
        out[tp] = base + 1 + before - start[tp]
        before += lengths[tp]
    return out
