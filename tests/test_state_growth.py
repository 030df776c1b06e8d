"""Does state grow without bound? (controlplane.alerting.state_growth): pure, synthetic series
of one operator's state over a 6 h window, sampled every 3 minutes."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.alerting.state_growth import Sample, assess, slope_per_hour

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
WINDOW = timedelta(hours=6)
STEP = timedelta(minutes=3)


def series(rows_at, *, hours: float = 6, step: timedelta = STEP, size_per_row: int = 100):
    """Samples from now - hours to now, rows given by rows_at(hours since the start)."""
    out = []
    count = int(timedelta(hours=hours) / step)
    for i in range(count + 1):
        at = NOW - timedelta(hours=hours) + i * step
        h = (at - (NOW - timedelta(hours=hours))).total_seconds() / 3600
        rows = max(0, round(rows_at(h)))
        out.append(Sample(at=at, rows=rows, size_bytes=rows * size_per_row))
    return out


def saw_tooth(h: float, period_hours: float, low: float, high: float) -> float:
    """Rises from low to high over each period, then the finished windows are evicted."""
    return low + (high - low) * ((h % period_hours) / period_hours)


def noisy(f, sigma: float, seed: float = 7):
    rng = random.Random(seed)  # noqa: S311 - test data, not secrets
    return lambda h: f(h) + rng.gauss(0, sigma)


def test_the_slope_is_least_squares_per_hour():
    points = [(NOW + timedelta(minutes=30 * i), 1000 + 250 * i) for i in range(5)]
    assert slope_per_hour(points) == pytest.approx(500)
    assert slope_per_hour(points[:1]) is None
    assert slope_per_hour([(NOW, 1), (NOW, 2)]) is None  # no time passed


def test_linear_growth_grows_without_bound():
    trend = assess(series(lambda h: 20_000 + 5_000 * h), NOW, WINDOW)
    assert trend.unbounded, trend.reason
    assert trend.rows_per_hour == pytest.approx(5_000, rel=0.01)
    assert trend.bytes_per_hour == pytest.approx(500_000, rel=0.01)
    assert trend.rows_now == 50_000
    assert trend.reason == "it kept rising for 6 h: +5,000 rows/h"


@pytest.mark.parametrize("period", [0.25, 1, 2, 2.5])
def test_a_bounded_saw_tooth_does_not(period):
    """A watermarked aggregation: windows fill up and are evicted, around a steady level;
    whatever the period against the window's parts."""
    trend = assess(series(lambda h: saw_tooth(h, period, 1_000, 50_000)), NOW, WINDOW)
    assert not trend.unbounded, trend


def test_a_noisy_bounded_saw_tooth_does_not():
    f = noisy(lambda h: saw_tooth(h, 0.75, 10_000, 40_000), sigma=3_000)
    assert not assess(series(f), NOW, WINDOW).unbounded


def test_a_saw_tooth_whose_floor_keeps_rising_does():
    """Eviction happens, but less goes than comes: the state still grows without bound."""
    f = noisy(lambda h: 3_000 * h + saw_tooth(h, 0.5, 0, 8_000), sigma=500)
    trend = assess(series(f), NOW, WINDOW)
    assert trend.unbounded, trend.reason
    assert 2_000 < trend.rows_per_hour < 4_000


def test_noisy_linear_growth_does():
    f = noisy(lambda h: 100_000 + 10_000 * h, sigma=4_000)
    assert assess(series(f), NOW, WINDOW).unbounded


@pytest.mark.parametrize("tau_hours", [0.5, 1.0, 1.5])
def test_growth_that_levels_off_does_not(tau_hours):
    """A new watermarked aggregation: its state rises until windows are evicted as fast as
    they open, then stays."""
    trend = assess(series(lambda h: 80_000 * (1 - math.exp(-h / tau_hours))), NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason.startswith("it levels off")
    assert trend.rows_per_hour > 0  # it did rise over the window


def test_a_rise_then_a_plateau_does_not():
    trend = assess(series(lambda h: min(h, 3) * 10_000), NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason.startswith("it stopped rising")


def test_a_saw_tooth_as_long_as_half_the_window_does_not():
    """Two ramps with one eviction between: back where it was, so bounded."""
    trend = assess(series(lambda h: saw_tooth(h, 3, 5_000, 60_000)), NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason.startswith("it stopped rising")


def test_random_series_are_told_apart():
    """Robustness, seeded: bounded saw-tooths of random period (6 min to 3 h), phase, height
    and noise are never taken for unbounded state, nor is noise around a level or growth
    that levels off; linear growth under noise and saw-tooths whose floor rises by more than
    their height over the window are found."""
    rng = random.Random(20261124)  # noqa: S311 - test data, not secrets

    def bounded(period, phase, low, height):
        return lambda h: saw_tooth(h + phase, period, low, low + height)

    def rising(period, low, height, rate):
        return lambda h: low + rate * h + saw_tooth(h, period, 0, height)

    def levelling(top, tau):
        return lambda h: top * (1 - math.exp(-h / tau))

    def line(level, rate):
        return lambda h: level + rate * h

    def flagged(f, sigma) -> int:
        return assess(series(noisy(f, sigma, rng.random())), NOW, WINDOW).unbounded

    found = {"bounded": 0, "flat": 0, "levels off": 0, "linear": 0, "rising saw-tooth": 0}
    for _ in range(150):
        period, phase = rng.uniform(0.1, 3), rng.uniform(0, 3)
        low, height, level = (
            rng.uniform(0, 50_000),
            rng.uniform(1_000, 100_000),
            rng.uniform(100, 1e6),
        )
        found["bounded"] += flagged(bounded(period, phase, low, height), height * 0.3)
        found["flat"] += flagged(line(level, 0), level * rng.uniform(0.001, 0.3))
        top = rng.uniform(1_000, 1e6)
        found["levels off"] += flagged(levelling(top, rng.uniform(0.3, 1.5)), top * 0.05)
        rate = level * rng.uniform(0.1, 1) / 6  # +10 % to +100 % over the window
        found["linear"] += flagged(line(level, rate), rate * 0.5)
        rate = height * rng.uniform(1.5, 4) / 6
        found["rising saw-tooth"] += flagged(rising(period / 2, low, height, rate), height * 0.1)
    assert found["bounded"] == found["flat"] == found["levels off"] == 0, found
    assert found["linear"] >= 145 and found["rising saw-tooth"] >= 140, found


def test_too_few_samples_do_not():
    few = series(lambda h: 1_000 * h, step=timedelta(hours=1))  # 7 samples
    trend = assess(few, NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason == "too few samples (7, at least 12)"
    assert trend.rows_per_hour == pytest.approx(1_000)
    empty = assess([], NOW, WINDOW)
    assert (empty.unbounded, empty.rows_per_hour, empty.rows_now) == (False, None, None)


def test_samples_covering_only_part_of_the_window_do_not():
    """A pipeline started two hours ago: its six-hour trend is not known yet."""
    recent = series(lambda h: 1_000 * h, hours=2)
    trend = assess(recent, NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason.startswith("the samples span 2 h of the 6 h window")


def test_a_pipeline_that_stopped_reporting_does_not():
    """Linear growth, but nothing reported for the last 1.5 h (stopped): not growing now."""
    stopped = [s for s in series(lambda h: 1_000 * h) if s.at <= NOW - timedelta(hours=1.5)]
    trend = assess(stopped, NOW, WINDOW)
    assert not trend.unbounded
    assert trend.reason.startswith("gaps in the samples")


def test_small_or_flat_state_does_not():
    assert "no material growth" in assess(series(lambda h: 50 + 5 * h), NOW, WINDOW).reason
    flat = assess(series(lambda h: 1_000_000 + 1_000 * h), NOW, WINDOW)  # +0.6 % in 6 h
    assert not flat.unbounded and "no material growth" in flat.reason


def test_samples_outside_the_window_and_unordered_are_fine():
    growing = series(lambda h: 5_000 * h, hours=12)
    trend = assess(list(reversed(growing)), NOW, WINDOW)
    assert trend.unbounded and trend.samples == 121  # only the last 6 h
    with pytest.raises(ValueError, match="positive"):
        assess(growing, NOW, timedelta(0))


def test_asking_twice_gives_the_same_answer():
    samples = series(lambda h: 5_000 * h)
    assert assess(samples, NOW, WINDOW) == assess(samples, NOW, WINDOW)
