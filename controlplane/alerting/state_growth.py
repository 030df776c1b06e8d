"""Does a stateful operator's state grow without bound? Pure: no Django, no Celery; time is
passed in.

A watermarked aggregation's state rises while its windows are open and falls as the
watermark finishes them and they are evicted: seen over hours it is a saw-tooth around a
level, or a rise that levels off once windows are evicted as fast as they are opened. State
that nothing evicts (a running count per key, deduplication without a watermark, a window
longer than anything the watermark ever finishes) keeps rising. `assess` tells them apart
from (time, rows, size) samples of one operator over a window ending now.

The decision ("grows without bound"), over the window [now - W, now]:

1. Enough data: at least MIN_SAMPLES samples, spanning at least MIN_COVERAGE of W, and
   samples in at least SEGMENTS - 1 of the SEGMENTS equal parts the window is cut into,
   the last part among them (a pipeline that stopped reporting is not growing).
2. Levels: each part's level is its floor, the FLOOR_QUANTILE quantile of its samples' rows:
   what is left once finished windows are evicted (the troughs of a saw-tooth whose period
   is shorter than a part), not moved by a single outlier (noise, a restart's reload). Its
   spread is the quantile 1 - FLOOR_QUANTILE minus the floor: the saw-tooth's and the
   noise's height.
3. It grows materially: the least-squares slope of rows over time is positive, and the
   last level exceeds the first by at least MIN_RISE_ROWS rows, MIN_RISE_FRACTION of the
   first level and SPREAD_FACTOR times the parts' median spread (a rise smaller than what
   the state swings by within a part is the saw-tooth's or the noise's, not growth).
4. It kept growing: at most MAX_FALLS times is a level below the one before it, and every
   level is above all the levels two or more parts before it. A bounded saw-tooth whose
   period is longer than a part falls, and falls back to where it was; noise may swap two
   neighbouring levels, not undo the rise.
5. No plateau: over the last third of the window (from the last level at least two parts
   before the last one) the levels still rise at least END_RISE times as fast as over the
   whole window; state that levels off (its windows now evicted as fast as they open)
   rises slowly or not at all there.

All five hold: it grows without bound. The rates reported are least-squares slopes over the
window's samples (rows per hour; bytes per hour where sizes are known). Choose W longer than
the state's own lifetime (the longest window plus the watermark's delay): within a shorter
window a state that will be evicted later cannot be told from one that never will.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

SEGMENTS = 6
MIN_SAMPLES = 12
MIN_COVERAGE = 0.75
MIN_RISE_FRACTION = 0.05
MIN_RISE_ROWS = 100
FLOOR_QUANTILE = 0.1
SPREAD_FACTOR = 1.0
MAX_FALLS = 1
END_RISE = 0.5


@dataclass(frozen=True)
class Sample:
    """One operator's state at one time: rows held and size in bytes (None: not reported)."""

    at: datetime
    rows: int
    size_bytes: int | None = None


@dataclass(frozen=True)
class OperatorSeries:
    """One stateful operator's samples (by its index in the query's stateOperators)."""

    operator: int
    name: str
    samples: tuple[Sample, ...]

    @property
    def label(self) -> str:
        return (
            f"operator {self.operator} ({self.name})" if self.name else f"operator {self.operator}"
        )


@dataclass(frozen=True)
class Trend:
    """What `assess` found: the rates, the verdict and why."""

    hours: float
    samples: int
    rows_per_hour: float | None
    bytes_per_hour: float | None
    unbounded: bool
    reason: str
    rows_now: int | None = None
    levels: tuple[int | None, ...] = ()

    def rates(self) -> str:
        """ "+6,000 rows/h, +1.1 MB/h" ("—" when unknown)."""
        if self.rows_per_hour is None:
            return "—"
        text = f"{self.rows_per_hour:+,.0f} rows/h"
        if self.bytes_per_hour is not None:
            text += f", {signed_size(self.bytes_per_hour)}/h"
        return text

    def as_dict(self) -> dict:
        return {
            "hours": self.hours,
            "samples": self.samples,
            "rows_per_hour": self.rows_per_hour,
            "bytes_per_hour": self.bytes_per_hour,
            "grows_without_bound": self.unbounded,
            "reason": self.reason,
            "rows_now": self.rows_now,
        }


def slope_per_hour(points: Sequence[tuple[datetime, float]]) -> float | None:
    """The least-squares slope of value over time, per hour; None with fewer than two
    distinct times."""
    if len(points) < 2:
        return None
    origin = points[0][0]
    xs = [(at - origin).total_seconds() / 3600 for at, _ in points]
    ys = [float(v) for _, v in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


def assess(samples: Sequence[Sample], now: datetime, window: timedelta) -> Trend:
    """The growth of one operator's state over [now - window, now] (see the module's
    docstring for the exact definition). Samples may come in any order; those outside the
    window are ignored."""
    if window <= timedelta(0):
        raise ValueError("the window must be positive")
    start = now - window
    inside = sorted((s for s in samples if start <= s.at <= now), key=lambda s: s.at)
    hours = window.total_seconds() / 3600
    rows_rate = slope_per_hour([(s.at, s.rows) for s in inside])
    sized = [(s.at, s.size_bytes) for s in inside if s.size_bytes is not None]
    bytes_rate = slope_per_hour(sized)

    def verdict(unbounded: bool, reason: str, levels=()) -> Trend:
        return Trend(
            hours=hours,
            samples=len(inside),
            rows_per_hour=rows_rate,
            bytes_per_hour=bytes_rate,
            unbounded=unbounded,
            reason=reason,
            rows_now=inside[-1].rows if inside else None,
            levels=tuple(levels),
        )

    if len(inside) < MIN_SAMPLES:
        return verdict(False, f"too few samples ({len(inside)}, at least {MIN_SAMPLES})")
    span = inside[-1].at - inside[0].at
    if span < window * MIN_COVERAGE:
        return verdict(
            False,
            f"the samples span {_hours(span)} of the {_hours(window)} window "
            f"(at least {MIN_COVERAGE:.0%})",
        )
    parts: list[list[int]] = [[] for _ in range(SEGMENTS)]
    for s in inside:
        index = min(SEGMENTS - 1, int((s.at - start) / window * SEGMENTS))
        parts[index].append(s.rows)
    levels = [_quantile(p, FLOOR_QUANTILE) if p else None for p in parts]
    present = [(i, level) for i, level in enumerate(levels) if level is not None]
    if len(present) < SEGMENTS - 1 or levels[-1] is None:
        return verdict(False, "gaps in the samples (no figures for part of the window)", levels)
    spread = statistics.median(
        _quantile(p, 1 - FLOOR_QUANTILE) - _quantile(p, FLOOR_QUANTILE) for p in parts if p
    )
    first, last = present[0][1], present[-1][1]
    rise = last - first
    needed = max(MIN_RISE_ROWS, MIN_RISE_FRACTION * max(first, 0), SPREAD_FACTOR * spread)
    if rows_rate is None or rows_rate <= 0 or rise < needed:
        return verdict(
            False, f"no material growth (a rise of {rise:,.0f} rows, {needed:,.0f} needed)", levels
        )
    falls = sum(1 for (_, a), (_, b) in pairwise(present) if b < a)
    if falls > MAX_FALLS:
        return verdict(False, f"it falls as often as it rises ({falls} of its levels fell)", levels)
    for j in range(2, len(present)):
        if present[j][1] <= max(level for _, level in present[: j - 1]):
            why = "it stopped rising (a level no higher than one earlier in the window)"
            return verdict(False, why, levels)
    end_index, end_level = present[-1]
    reference = next(
        ((i, level) for i, level in reversed(present) if i <= end_index - 2), present[0]
    )
    mean_rate = rise / (end_index - present[0][0])
    end_rate = (end_level - reference[1]) / (end_index - reference[0])
    if end_rate < END_RISE * mean_rate:
        return verdict(False, "it levels off (the last third of the window rises little)", levels)
    return verdict(
        True,
        f"it kept rising for {_hours(window)}: {rows_rate:+,.0f} rows/h",
        levels,
    )


def signed_size(value: float) -> str:
    """+1.1 MB: a sign and a size, in the units of Django's filesizeformat (1 KB = 1024
    bytes), as the pages show sizes."""
    sign, size = ("-" if value < 0 else "+"), abs(value)
    if size < 1024:
        return f"{sign}{size:.0f} B"
    for unit in ("KB", "MB", "GB"):
        size /= 1024
        if size < 1024 or unit == "GB":
            break
    return f"{sign}{size:,.1f} {unit}"


def _quantile(values: list[int], q: float) -> int:
    """The value below which a share q of `values` lies (the nearest rank below)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def _hours(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:g} h" if hours >= 1 else f"{delta.total_seconds() / 60:.0f} min"
