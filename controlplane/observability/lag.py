"""Kafka lag and backpressure maths: plain Python, time passed in.

Lag status as LinkedIn's Burrow judges a consumer: not from the lag at one moment (a
micro-batch job's lag is a saw-tooth: it grows between commits and drops at each), but over
the commits in a window (the last `window` seconds of the collector's samples: time, total
lag, sum of committed offsets). Each commit is the committed position that samples saw; its
lag is the lowest lag sampled while it stood (the nearest to the moment it was made). Then:

  stopped   the pipeline is not running (its lag is still computed: it grows while stopped)
  ok        no lag now; or some commit in the window had no lag (Burrow's rule 1: it
            caught up); or the lag at commits went down at least once (it keeps up)
  stalled   lag > 0 and the committed offsets did not move over the window (at least half
            of it sampled: Burrow's "stall")
  lagging   lag > 0 at every commit in the window, never lower than at the commit before,
            over at least MIN_COMMITS commits and samples spanning at least half the window,
            and higher at the last than at the first by more than `noise` (Burrow's
            "warning": the job reads slower than producers write)

`noise` is the most lag a job that keeps up shows between its commits: what arrives while a
trigger interval and a batch pass (input rate x (trigger + batch duration)). A micro-batch job
that keeps up can drift up for a while within that (a reader's fetch sizes, a slower batch) and
catch up; only growth beyond it over the window is falling behind. So a job that keeps up reads
`ok` between its commits whatever its trigger, and one that falls behind reads `lagging` once
half a window of commits shows it.

Backpressure, Spark's counterpart of Flink's OK / LOW / HIGH. Flink measures the share of
time a task is blocked by its downstream (OK <= 10 %, LOW <= 50 %, HIGH above). A micro-batch
query is never blocked that way; what tells that the sink (or anything else) holds it back
is how much of each trigger interval a batch takes to process, the busy ratio
(batch duration / trigger interval):

  ok     busy < 0.5: the job is idle more than half of each interval, with room to spare
  low    0.5 <= busy < 1.0: it keeps up, but a burst or a slower sink will tip it over
  high   busy >= 1.0 (batches take longer than the trigger, so they run back to back and
         data waits), or batches are capped by max_records_per_batch while lag grows
         (admission control is all that keeps batches bounded: the job cannot catch up)

With a trigger interval of 0 (batches back to back) the busy ratio is 1.0 while there is
data to read, so only the cap-and-growing-lag rule tells `high` from `low`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise

BUSY_LOW = 0.5
BUSY_HIGH = 1.0


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None  # the next offset the job will read (None: not read yet)
    end: int  # the log end offset
    lag: int

    def as_dict(self) -> dict:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "committed": self.committed,
            "end": self.end,
            "lag": self.lag,
        }


def partition_lags(
    committed: dict[tuple[str, int], int],
    ends: dict[tuple[str, int], int],
    earliest: dict[tuple[str, int], int] | None = None,
) -> list[PartitionLag]:
    """Records between what the job committed and each log end. A partition the job has not
    read yet lags by everything still in it (from `earliest`, 0 if unknown)."""
    out = []
    for (topic, partition), end in sorted(ends.items()):
        position = committed.get((topic, partition))
        start = position if position is not None else (earliest or {}).get((topic, partition), 0)
        out.append(PartitionLag(topic, partition, position, end, max(0, end - start)))
    return out


@dataclass(frozen=True)
class Sample:
    at: datetime
    lag: int  # total records behind
    committed: int  # sum of committed offsets: it moves when the job makes progress


@dataclass(frozen=True)
class LagStatus:
    status: str  # ok, lagging, stalled, stopped
    trend: float | None  # records per second the lag changes by (> 0: growing)
    eta_seconds: float | None  # time to catch up at the current trend, if it shrinks

    def as_dict(self) -> dict:
        return {"status": self.status, "trend": self.trend, "eta_seconds": self.eta_seconds}


# Commits a window must hold to call a lag `lagging` (Burrow's window holds 10 commits; a
# collector samples every 10 s by default, so the 60 s window holds about 6).
MIN_COMMITS = 3


def lag_status(
    samples: Sequence[Sample],
    *,
    running: bool,
    now: datetime,
    window: float,
    noise: float = 0.0,
) -> LagStatus:
    """The lag's status over the samples of the last `window` seconds (oldest first or not);
    `noise`: the lag a job that keeps up shows between commits (see the module's docstring)."""
    recent = sorted(
        (s for s in samples if (now - s.at).total_seconds() <= window), key=lambda s: s.at
    )
    trend = (
        _slope([((s.at - recent[0].at).total_seconds(), s.lag) for s in recent])
        if len(recent) >= 2
        else None
    )
    latest = recent[-1].lag if recent else None
    eta = None
    if trend is not None and trend < 0 and latest:
        eta = latest / -trend
    if not running:
        return LagStatus("stopped", trend, None)
    if not latest or len(recent) < 2:
        return LagStatus("ok", trend, eta)
    spans_window = (recent[-1].at - recent[0].at).total_seconds() >= window / 2
    if spans_window and recent[-1].committed == recent[0].committed:
        return LagStatus("stalled", trend, None)
    lags = commits(recent)
    if 0 in lags:
        return LagStatus("ok", trend, eta)
    never_down = all(later >= earlier for earlier, later in pairwise(lags))
    grew = lags[-1] - lags[0] > max(0.0, noise)
    if len(lags) >= MIN_COMMITS and spans_window and never_down and grew:
        return LagStatus("lagging", trend, None)
    return LagStatus("ok", trend, eta)


def commits(samples: Sequence[Sample]) -> list[int]:
    """The lag at each commit the samples saw (oldest first): a commit is a committed
    position, its lag the lowest sampled while it stood."""
    out: list[int] = []
    position = None
    for sample in samples:
        if sample.committed != position:
            out.append(sample.lag)
            position = sample.committed
        else:
            out[-1] = min(out[-1], sample.lag)
    return out


@dataclass(frozen=True)
class Batch:
    duration_ms: float
    input_rows: int


@dataclass(frozen=True)
class Backpressure:
    level: str  # ok, low, high
    busy_ratio: float | None
    capped_share: float  # share of the recent batches that hit max_records_per_batch
    reason: str

    def as_dict(self) -> dict:
        return {
            "level": self.level,
            "busy_ratio": self.busy_ratio,
            "capped_share": self.capped_share,
            "reason": self.reason,
        }


def backpressure(
    batches: Sequence[Batch],
    *,
    trigger_seconds: float,
    max_records_per_batch: int | None,
    lag_growing: bool,
) -> Backpressure:
    """The level over recent batches with data (see the module's docstring for the rules)."""
    busy_batches = [b for b in batches if b.input_rows > 0]
    if not busy_batches:
        return Backpressure("ok", 0.0 if batches else None, 0.0, "no batch with data")
    mean_ms = sum(b.duration_ms for b in busy_batches) / len(busy_batches)
    busy = 1.0 if trigger_seconds <= 0 else mean_ms / (trigger_seconds * 1000)
    capped = 0.0
    if max_records_per_batch:
        capped = sum(b.input_rows >= max_records_per_batch for b in busy_batches) / len(
            busy_batches
        )
    if capped >= 0.5 and lag_growing:
        return Backpressure(
            "high", busy, capped, "batches are capped by max_records_per_batch and lag grows"
        )
    if trigger_seconds > 0 and busy >= BUSY_HIGH:
        return Backpressure(
            "high", busy, capped, f"batches take {busy:.0%} of the trigger interval"
        )
    if busy >= BUSY_LOW:
        return Backpressure("low", busy, capped, f"batches take {busy:.0%} of the trigger interval")
    return Backpressure("ok", busy, capped, f"batches take {busy:.0%} of the trigger interval")


def _slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x; None if x does not vary."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / var


def time_until_loss(
    oldest_unread_ms: dict[tuple[str, int], int], retention: dict[str, int | None], now_ms: int
) -> dict | None:
    """How long until Kafka's retention may delete records the pipeline has not read yet:
    for each partition with unread records, the time of its oldest unread record plus its
    topic's retention.ms, minus now (Kafka deletes a segment once its newest record is that
    old, so this is the earliest it can happen). The soonest partition, or None when nothing
    unread is under time-based retention."""
    soonest = None
    for (topic, partition), at in oldest_unread_ms.items():
        keep = retention.get(topic)
        if keep is None:
            continue
        seconds = max(0.0, (at + keep - now_ms) / 1000)
        if soonest is None or seconds < soonest["seconds"]:
            soonest = {
                "seconds": round(seconds, 1),
                "topic": topic,
                "partition": partition,
                "retention_ms": keep,
            }
    return soonest
