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
