"""Restart policies (pure logic, time passed in): our cases and properties. Flink's own unit
tests of its strategies, ported, are in tests/test_restarts_flink.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.supervision.restarts import Failure, decide, describe
from jobs.spec.model import ExponentialDelay, FailureRate, FixedDelay, NoRestart

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def failures(*seconds: float, ran: float = 5.0) -> list[Failure]:
    """Failures at these times, each of a run that had been up for `ran` seconds."""
    return [Failure(at=at(s), started_at=at(s - ran)) for s in seconds]


# -- fixed-delay ---------------------------------------------------------------------------------


def test_fixed_delay_restarts_after_its_delay_then_gives_up_after_its_attempts():
    policy = FixedDelay(attempts=3, delay_seconds=10)
    first = decide(policy, failures(100), now=at(100))
    assert (first.restart, first.restart_at, first.attempt) == (True, at(110), 1)
    third = decide(policy, failures(100, 200, 300), now=at(300))
    assert (third.restart, third.attempt) == (True, 3)
    fourth = decide(policy, failures(100, 200, 300, 400), now=at(400))
    assert fourth.gave_up
    assert fourth.reason == (
        "gave up: 4 failures since the last start exceed fixed-delay(attempts 3, delay 10 s)"
    )


def test_fixed_delay_defaults_to_one_attempt_as_flink():
    assert decide(FixedDelay(), failures(1), now=at(1)).restart
    assert decide(FixedDelay(), failures(1, 50), now=at(50)).gave_up


# -- failure-rate --------------------------------------------------------------------------------


def test_failure_rate_gives_up_when_failures_in_the_trailing_interval_exceed_the_maximum():
    policy = FailureRate(max_failures=3, interval_seconds=300, delay_seconds=5)
    assert decide(policy, failures(0, 100, 200), now=at(200)).restart
    verdict = decide(policy, failures(0, 100, 200, 250), now=at(250))
    assert verdict.gave_up
    assert verdict.reason == (
        "gave up: 4 failures in 300 s exceed failure-rate(max 3 per 300 s, delay 5 s)"
    )


def test_failure_rate_counts_a_failure_exactly_one_interval_ago():
    policy = FailureRate(max_failures=3, interval_seconds=300, delay_seconds=5)
    # Flink gives up unless the oldest of the last 4 failures is *more* than 300 s old.
    assert decide(policy, failures(0, 100, 200, 300), now=at(300)).gave_up
    assert decide(policy, failures(0, 100, 200, 300.001), now=at(300.001)).restart


def test_failure_rate_forgets_failures_older_than_its_interval():
    policy = FailureRate(max_failures=3, interval_seconds=300, delay_seconds=5)
    # Failures at 0 and 100 are more than 300 s before the one at 420.
    verdict = decide(policy, failures(0, 100, 200, 250, 420), now=at(420))
    assert verdict.restart
    assert verdict.restart_at == at(425)
    assert "3 of at most 3 failures in 300 s" in verdict.reason


# -- exponential-delay ---------------------------------------------------------------------------


def exponential_delays(policy, count: int, seed: str) -> list[float]:
    """The delays of `count` restarts in a row, each restarted run failing 30 s later."""
    times, delays = [], []
    for i in range(1, count + 1):
        times.append(30.0 * i)
        delays.append(decide(policy, failures(*times), now=at(times[-1]), seed=seed).delay_seconds)
    return delays


def test_exponential_delay_grows_by_the_multiplier_up_to_the_maximum_within_jitter():
    policy = ExponentialDelay(
        initial_backoff_seconds=1, max_backoff_seconds=10, multiplier=2, jitter=0.1
    )
    # Backoffs 1, 2, 4, 8, 16, 32, 64 s, +/- 10 %, then capped at 10 s and never below 1 s:
    # the jitter is applied before the cap, so 16 s - 10 % is still above the maximum.
    bounds = [(1, 1.1), (1.8, 2.2), (3.6, 4.4), (7.2, 8.8), (10, 10), (10, 10), (10, 10)]
    for seed in ("p1", "p2", "p3"):
        delays = exponential_delays(policy, 7, seed)
        for delay, (low, high) in zip(delays, bounds, strict=True):
            assert low <= delay <= high
    assert decide(policy, failures(*[30.0 * i for i in range(1, 8)]), now=at(210)).attempt == 7


def test_exponential_delay_with_jitter_never_falls_below_the_initial_backoff():
    policy = ExponentialDelay(
        initial_backoff_seconds=10, max_backoff_seconds=60, multiplier=2, jitter=1
    )
    firsts = {exponential_delays(policy, 1, str(seed))[0] for seed in range(200)}
    assert min(firsts) == 10  # 10 s - up to 100 %: raised to the initial backoff
    assert max(firsts) <= 20


def test_exponential_delay_resets_after_a_healthy_run():
    policy = ExponentialDelay(
        initial_backoff_seconds=2, multiplier=3, jitter=0, reset_after_seconds=600
    )
    history = failures(10, 40, 80)  # backoff 2, 6, 18
    assert decide(policy, history, now=at(80)).delay_seconds == 18
    healthy = [*history, Failure(at=at(2000), started_at=at(1000))]  # up for 1000 s >= 600
    verdict = decide(policy, healthy, now=at(2000))
    assert (verdict.delay_seconds, verdict.attempt) == (2, 1)
    assert "backoff reset after a healthy run" in verdict.reason


def test_a_failure_while_a_restart_is_pending_is_merged_into_it():
    policy = ExponentialDelay(initial_backoff_seconds=10, multiplier=2, jitter=0)
    first = decide(policy, failures(100), now=at(100))
    assert first.restart_at == at(110)
    # A second report of trouble (say "stalled" after "vanished") 3 s later.
    merged = decide(policy, failures(100, 103), now=at(103))
    assert (merged.restart_at, merged.attempt, merged.merged) == (at(110), 1, True)
    assert merged.delay_seconds == 7  # what is left of the pending delay
    assert "merged" in merged.reason
    # One at the very instant the restart is due is merged too (Flink: now <= next restart).
    instant = decide(policy, failures(100, 103, 110), now=at(110))
    assert (instant.restart_at, instant.attempt, instant.merged) == (at(110), 1, True)
    # Unless the failed run is the one the restart launched, at its time: no longer pending.
    relaunched = Failure(at=at(110), started_at=at(110))
    again = decide(policy, [*failures(100), relaunched], now=at(110))
    assert (again.restart_at, again.attempt, again.merged) == (at(130), 2, False)
    # The next millisecond is a new attempt, with a grown backoff.
    after = decide(policy, failures(100, 103, 110.001), now=at(110.001))
    assert (after.restart_at, after.attempt, after.merged) == (at(130.001), 2, False)


def test_exponential_delay_gives_up_after_max_attempts():
    policy = ExponentialDelay(initial_backoff_seconds=1, jitter=0, max_attempts=2)
    assert decide(policy, failures(10, 20), now=at(20)).restart
    verdict = decide(policy, failures(10, 20, 30), now=at(30))
    assert verdict.gave_up
    assert verdict.reason.startswith("gave up: 3 restarts since the backoff was last reset")


# -- every policy --------------------------------------------------------------------------------


def test_a_permanent_failure_is_never_restarted():
    permanent = [Failure(at=at(5), cause="definition error", permanent=True)]
    for policy in (FixedDelay(attempts=9), FailureRate(max_failures=9), ExponentialDelay()):
        verdict = decide(policy, permanent, now=at(5))
        assert verdict.gave_up
        assert verdict.reason == "gave up: definition error is permanent (restarting cannot fix it)"


def test_policy_none_never_restarts():
    assert (
        decide(NoRestart(), failures(1), now=at(1)).reason == "gave up: the restart policy is none"
    )


def test_a_late_decision_is_due_at_once_not_in_the_past():
    verdict = decide(FixedDelay(attempts=1, delay_seconds=10), failures(0), now=at(60))
    assert verdict.restart_at == at(60)


def test_describe_names_each_policy_and_its_settings():
    assert describe(ExponentialDelay(max_attempts=5)) == (
        "exponential-delay(1 s to 60 s, x1.5, max 5 attempts)"
    )
    assert describe(NoRestart()) == "none"


# -- properties ----------------------------------------------------------------------------------

policies = st.one_of(
    st.builds(
        FixedDelay,
        attempts=st.integers(1, 10),
        delay_seconds=st.floats(0, 600, allow_nan=False),
    ),
    st.builds(
        FailureRate,
        max_failures=st.integers(1, 10),
        interval_seconds=st.floats(1, 3600, allow_nan=False),
        delay_seconds=st.floats(0, 600, allow_nan=False),
    ),
    st.builds(
        ExponentialDelay,
        initial_backoff_seconds=st.floats(0.001, 100, allow_nan=False),
        max_backoff_seconds=st.floats(100, 3600, allow_nan=False),
        multiplier=st.floats(1, 5, exclude_min=True, allow_nan=False),
        jitter=st.floats(0, 1, allow_nan=False),
        reset_after_seconds=st.floats(1, 7200, allow_nan=False),
        max_attempts=st.one_of(st.none(), st.integers(1, 20)),
    ),
)
histories = st.lists(
    st.tuples(st.floats(0, 100_000, allow_nan=False), st.floats(0, 10_000, allow_nan=False)),
    min_size=1,
    max_size=25,
).map(lambda pairs: [Failure(at=at(t), started_at=at(t - up)) for t, up in pairs])


def max_delay(policy) -> float:
    """The longest delay the policy may give: its setting in whole milliseconds."""
    if isinstance(policy, ExponentialDelay):
        return round(policy.max_backoff_seconds * 1000) / 1000
    return round(policy.delay_seconds * 1000) / 1000


@settings(max_examples=300, deadline=None)
@given(policy=policies, history=histories, late=st.floats(0, 10_000, allow_nan=False))
def test_delays_are_bounded_never_in_the_past_and_asking_twice_changes_nothing(
    policy, history, late
):
    last = max(f.at for f in history)
    now = last + timedelta(seconds=late)
    verdict = decide(policy, history, now, seed="p")
    assert verdict == decide(policy, list(reversed(history)), now, seed="p")
    if verdict.restart:
        assert 0 <= verdict.delay_seconds <= max_delay(policy) + 1e-9
        assert verdict.restart_at >= now
        assert verdict.restart_at >= last
        assert verdict.attempt >= 1
        if isinstance(policy, ExponentialDelay) and not verdict.merged:
            assert verdict.delay_seconds >= round(policy.initial_backoff_seconds * 1000) / 1000
        # Asked again any time before the restart is due: the same restart time.
        if verdict.restart_at > now:
            middle = now + (verdict.restart_at - now) / 2
            assert decide(policy, history, middle, seed="p").restart_at == verdict.restart_at
    else:
        assert verdict.reason.startswith("gave up: ")
