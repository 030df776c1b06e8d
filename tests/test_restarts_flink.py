"""Flink's own unit tests of its restart strategies, ported to our restart policies.

The sources: flink-runtime's `org.apache.flink.runtime.executiongraph.failover`
`FixedDelayRestartBackoffTimeStrategyTest`, `FailureRateRestartBackoffTimeStrategyTest` and
`ExponentialDelayRestartBackoffTimeStrategyTest` (Flink 1.19 onwards: 1.20 and 2.x), each
test below naming the one it ports, with the same parameters and the same answers. Flink's
tests drive a strategy object with a ManualClock in milliseconds; ours is a pure function of
the failures and `now`, so `Strategy` below replays Flink's calls over `decide()`:

* `notifyFailure()`  -> a failure at the clock's time, appended to the history; its answer,
  "a new attempt", is `not decision.merged`;
* `canRestart()`     -> `decision.restart`;
* `getBackoffTime()` -> the time from the clock to `decision.restart_at`.

A failure after the restart's time is the failure of the run that restart started, at that
time (Flink's nextRestartTimestamp), so its uptime, which we measure for the reset, is the
time Flink measures from its last restart; one at or before it, of the run before.
Flink's jitter comes from ThreadLocalRandom and its tests assert the set of values 1000 draws
give; ours is drawn from a seed, so the same sets are asserted over 1000 seeds.

Last, Flink's checks on the strategies' settings are refused with a field error: through the
API and the form, as an editor sending a spec.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from controlplane.accounts.roles import set_role
from controlplane.definitions.models import Pipeline
from controlplane.supervision.restarts import Decision, Failure, decide
from jobs.spec import parse_spec
from jobs.spec.model import ExponentialDelay, FailureRate, FixedDelay, RestartPolicy
from tests.factories import valid_spec

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)
INTEGER_MAX_VALUE_MS = 2**31 - 1  # Flink's tests' "never" for the reset threshold and attempts


def ms(milliseconds: float) -> float:
    """Flink's milliseconds as our settings' seconds."""
    return milliseconds / 1000


class ManualClock:
    """org.apache.flink.util.clock.ManualClock: starts at 0, moves when told, in ms."""

    def __init__(self) -> None:
        self.millis = 0

    def advance_time(self, milliseconds: int) -> None:
        self.millis += milliseconds

    @property
    def now(self) -> datetime:
        return T0 + timedelta(milliseconds=self.millis)


class Strategy:
    """A Flink RestartBackoffTimeStrategy, as our decide() answers it."""

    def __init__(self, policy: RestartPolicy, clock: ManualClock | None = None, seed: str = ""):
        self.policy = policy
        self.clock = clock or ManualClock()
        self.seed = seed
        self.failures: list[Failure] = []
        self.decision: Decision | None = None
        self.run_started = self.clock.now  # the job was started by hand now
        self.pending: datetime | None = None  # the restart scheduled, not yet happened

    def notify_failure(self) -> bool:
        now = self.clock.now
        if self.pending is not None and self.pending < now:
            self.run_started = self.pending  # the restart happened: the failed run began then
        self.failures.append(Failure(at=now, started_at=self.run_started))
        self.decision = decide(self.policy, self.failures, now, seed=self.seed)
        self.pending = self.decision.restart_at if self.decision.restart else None
        return not self.decision.merged

    def can_restart(self) -> bool:
        return self.decision is None or self.decision.restart

    def get_backoff_time(self) -> int:
        assert self.decision is not None and self.decision.restart_at is not None
        left = max(timedelta(0), self.decision.restart_at - self.clock.now)
        return left // timedelta(milliseconds=1)


def exponential(
    initial_ms: int,
    max_ms: int,
    multiplier: float,
    reset_ms: int,
    jitter: float,
    attempts: int | None = INTEGER_MAX_VALUE_MS,
) -> ExponentialDelay:
    """Flink's constructor's arguments, in its order (attempts: attemptsBeforeResetBackoff)."""
    return ExponentialDelay(
        initial_backoff_seconds=ms(initial_ms),
        max_backoff_seconds=ms(max_ms),
        multiplier=multiplier,
        reset_after_seconds=ms(reset_ms),
        jitter=jitter,
        max_attempts=attempts,
    )


# -- FixedDelayRestartBackoffTimeStrategyTest ----------------------------------------------------


def test_fixed_delay_number_of_restarts():
    """Ports FixedDelayRestartBackoffTimeStrategyTest.testNumberOfRestarts."""
    number_of_restarts = 3
    strategy = Strategy(FixedDelay(attempts=number_of_restarts, delay_seconds=0))
    for _ in range(number_of_restarts):
        strategy.notify_failure()
        # Two calls to canRestart(), to make sure it does not maintain the counter: asking
        # decide() again with the same history gives the same answer.
        assert strategy.can_restart()
        assert decide(strategy.policy, strategy.failures, strategy.clock.now).restart
    strategy.notify_failure()
    assert not strategy.can_restart()


def test_fixed_delay_backoff_time():
    """Ports FixedDelayRestartBackoffTimeStrategyTest.testBackoffTime."""
    backoff_time_ms = 10_000
    strategy = Strategy(FixedDelay(attempts=1, delay_seconds=ms(backoff_time_ms)))
    strategy.notify_failure()
    assert strategy.get_backoff_time() == backoff_time_ms
    assert strategy.decision.delay_seconds == 10


# -- FailureRateRestartBackoffTimeStrategyTest ---------------------------------------------------


def test_failure_rate_many_failures_within_rate():
    """Ports FailureRateRestartBackoffTimeStrategyTest.testManyFailuresWithinRate."""
    num_failures = 3
    interval_ms = 1
    clock = ManualClock()
    strategy = Strategy(
        FailureRate(max_failures=1, interval_seconds=ms(interval_ms), delay_seconds=0), clock
    )
    for _ in range(num_failures):
        strategy.notify_failure()
        assert strategy.can_restart()
        clock.advance_time(interval_ms + 1)
    assert strategy.can_restart()


def test_failure_rate_failures_exceeding_rate():
    """Ports FailureRateRestartBackoffTimeStrategyTest.testFailuresExceedingRate."""
    num_failures = 3
    interval_ms = 10_000
    strategy = Strategy(
        FailureRate(max_failures=num_failures, interval_seconds=ms(interval_ms), delay_seconds=0)
    )
    for _ in range(num_failures):
        strategy.notify_failure()  # all at the same instant: the clock does not move
        assert strategy.can_restart()
    strategy.notify_failure()
    assert not strategy.can_restart()


def test_failure_rate_backoff_time():
    """Ports FailureRateRestartBackoffTimeStrategyTest.testBackoffTime."""
    backoff_time_ms = 10_000
    strategy = Strategy(
        FailureRate(max_failures=1, interval_seconds=ms(1), delay_seconds=ms(backoff_time_ms))
    )
    strategy.notify_failure()
    assert strategy.get_backoff_time() == backoff_time_ms


def test_failure_rate_a_failure_exactly_one_interval_before_still_counts():
    """Ports FailureRateRestartBackoffTimeStrategy.canRestart's `(now - earliestFailure) >
    failuresIntervalMS`: the window's both ends count (no Flink test pins this edge)."""
    clock = ManualClock()
    strategy = Strategy(
        FailureRate(max_failures=1, interval_seconds=ms(10), delay_seconds=0), clock
    )
    strategy.notify_failure()
    clock.advance_time(10)
    strategy.notify_failure()
    assert not strategy.can_restart()
    clock = ManualClock()
    strategy = Strategy(strategy.policy, clock)
    strategy.notify_failure()
    clock.advance_time(11)
    strategy.notify_failure()
    assert strategy.can_restart()


# -- ExponentialDelayRestartBackoffTimeStrategyTest ----------------------------------------------


def test_exponential_max_attempts():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testMaxAttempts."""
    max_attempts = 13
    clock = ManualClock()
    max_backoff_ms = 3
    strategy = Strategy(exponential(1, max_backoff_ms, 1.2, 10, 0.25, max_attempts), clock)
    for _ in range(max_attempts + 1):
        assert strategy.can_restart()
        assert strategy.notify_failure()
        clock.advance_time(max_backoff_ms + 1)
    assert not strategy.can_restart()


def test_exponential_not_call_notify_failure():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testNotCallNotifyFailure: a
    backoff is asked for before any failure."""
    with pytest.raises(ValueError, match="needs at least one failure"):
        decide(exponential(42, 45, 2.0, 8, 0, 10), [], T0)


def test_exponential_initial_backoff():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testInitialBackoff."""
    initial_backoff_ms = 42
    strategy = Strategy(exponential(initial_backoff_ms, 45, 2.0, 8, 0))
    strategy.notify_failure()
    assert strategy.get_backoff_time() == initial_backoff_ms


def test_exponential_max_backoff():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testMaxBackoff."""
    max_backoff_ms = 6
    for seed in range(100):
        strategy = Strategy(exponential(1, max_backoff_ms, 2.0, 8, 0.25), seed=str(seed))
        for _ in range(10):
            strategy.notify_failure()
            assert strategy.get_backoff_time() <= max_backoff_ms


def test_exponential_reset_backoff():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testResetBackoff."""
    initial_backoff_ms = 1
    reset_backoff_threshold_ms = 8
    clock = ManualClock()
    strategy = Strategy(
        exponential(initial_backoff_ms, 5, 2.0, reset_backoff_threshold_ms, 0.25), clock
    )
    assert strategy.notify_failure()

    clock.advance_time(reset_backoff_threshold_ms + strategy.get_backoff_time() - 1)
    assert strategy.notify_failure()
    assert strategy.get_backoff_time() == 2, "Backoff should be increased"

    clock.advance_time(reset_backoff_threshold_ms + strategy.get_backoff_time())
    assert strategy.notify_failure()
    assert strategy.get_backoff_time() == initial_backoff_ms, "Backoff should be reset"
    assert "backoff reset after a healthy run" in strategy.decision.reason


def test_exponential_backoff_multiplier():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testBackoffMultiplier."""
    max_backoff_ms = 300
    clock = ManualClock()
    strategy = Strategy(exponential(4, max_backoff_ms, 2.3, INTEGER_MAX_VALUE_MS, 0, 10), clock)
    for expected in (4, 9, 21):  # 4, 4 * 2.3, 4 * 2.3 * 2.3: whole ms, truncated
        assert strategy.notify_failure()
        assert strategy.get_backoff_time() == expected
        clock.advance_time(max_backoff_ms + 1)


def backoffs_of_fresh_strategies(
    policy: ExponentialDelay, clock: ManualClock, advance_ms: int, failure_count: int
) -> set[int]:
    """Flink's assertCorrectRandomRangeWithFailureCount: 1000 new strategies from one factory
    (here: 1000 seeds), each failing `failure_count` times `advance_ms` apart; the backoffs
    of their last failures."""
    backoffs = set()
    for seed in range(1000):
        strategy = Strategy(policy, clock, seed=str(seed))
        for _ in range(failure_count):
            clock.advance_time(advance_ms)
            assert strategy.notify_failure()
        backoffs.add(strategy.get_backoff_time())
    return backoffs


def test_exponential_jitter():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testJitter."""
    initial_backoff_ms, max_backoff_ms = 2, 7
    clock = ManualClock()
    policy = exponential(initial_backoff_ms, max_backoff_ms, 2.0, INTEGER_MAX_VALUE_MS, 0.25)
    advance = max_backoff_ms + 1
    assert backoffs_of_fresh_strategies(policy, clock, advance, 2) == {3, 4, 5}
    assert backoffs_of_fresh_strategies(policy, clock, advance, 3) == {6, 7}
    assert backoffs_of_fresh_strategies(policy, clock, advance, 4) == {7}


def test_exponential_jitter_no_higher_than_max():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testJitterNoHigherThanMax (and
    shows a delay is never below the initial backoff, whatever the jitter)."""
    max_backoff_ms = 7
    clock = ManualClock()
    policy = exponential(1, max_backoff_ms, 2.0, INTEGER_MAX_VALUE_MS, 1)
    advance = max_backoff_ms + 1
    assert backoffs_of_fresh_strategies(policy, clock, advance, 1) == {1, 2}
    assert backoffs_of_fresh_strategies(policy, clock, advance, 2) == {1, 2, 3, 4}
    assert backoffs_of_fresh_strategies(policy, clock, advance, 3) == {1, 2, 3, 4, 5, 6, 7}


def test_exponential_multiple_settings():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest.testMultipleSettings."""
    clock = ManualClock()
    initial_backoff_ms, max_backoff_ms, reset_backoff_threshold_ms = 1, 9, 80
    strategy = Strategy(
        exponential(initial_backoff_ms, max_backoff_ms, 2.0, reset_backoff_threshold_ms, 0.25),
        clock,
    )
    # ensure initial data
    assert strategy.notify_failure()
    assert strategy.can_restart()
    assert strategy.get_backoff_time() == initial_backoff_ms

    # ensure backoff time is initial after the first failure
    clock.advance_time(reset_backoff_threshold_ms + 1)
    assert strategy.notify_failure()
    assert strategy.can_restart()
    assert strategy.get_backoff_time() == initial_backoff_ms

    # ensure backoff increases until threshold is reached
    clock.advance_time(4)
    assert strategy.notify_failure()
    assert strategy.can_restart()
    assert strategy.get_backoff_time() == 2

    # ensure backoff is reset after threshold is reached
    clock.advance_time(reset_backoff_threshold_ms + 9 + 1)
    assert strategy.notify_failure()
    assert strategy.can_restart()
    assert strategy.get_backoff_time() == 1
    clock.advance_time(max_backoff_ms + 1)

    # ensure backoff still increases
    assert strategy.notify_failure()
    assert strategy.can_restart()
    assert strategy.get_backoff_time() == 2


def check_multiple_exceptions_are_merged(
    clock: ManualClock, expected_backoff_ms: int, strategy: Strategy
) -> None:
    """Flink's checkMultipleExceptionsAreMerged."""
    expected_new_attempt = True
    for advance_ms in range(expected_backoff_ms):
        for _ in range(10):
            assert strategy.notify_failure() == expected_new_attempt
            expected_new_attempt = False  # only the first one is a new attempt
            assert strategy.can_restart()
            assert strategy.get_backoff_time() == expected_backoff_ms - advance_ms
        clock.advance_time(1)


def test_exponential_merge_multiple_exceptions_into_one_attempt():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest
    .testMergeMultipleExceptionsIntoOneAttempt."""
    clock = ManualClock()
    initial_backoff_ms, backoff_multiplier, max_backoff_ms = 2, 2.0, 6
    strategy = Strategy(
        exponential(initial_backoff_ms, max_backoff_ms, backoff_multiplier, 80, 0.0, 3), clock
    )
    # All exceptions merged into one attempt if the time is same.
    current_backoff_ms = initial_backoff_ms
    check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

    # After advance time it's a new round, so new exception will be a new attempt.
    clock.advance_time(1)
    current_backoff_ms = int(current_backoff_ms * backoff_multiplier)
    check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

    # After advance time it's a new round, so new exception will be a new attempt.
    clock.advance_time(1)
    current_backoff_ms = max_backoff_ms
    check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

    # After advance time it's a new round, and it reaches the maxAttempts.
    clock.advance_time(1)
    assert strategy.notify_failure()
    assert not strategy.can_restart()


def test_exponential_merging_exceptions_works_with_resetting():
    """Ports ExponentialDelayRestartBackoffTimeStrategyTest
    .testMergingExceptionsWorksWithResetting."""
    clock = ManualClock()
    initial_backoff_ms, backoff_multiplier, max_backoff_ms = 2, 2.0, 6
    reset_backoff_threshold_ms = 80
    strategy = Strategy(
        exponential(
            initial_backoff_ms, max_backoff_ms, backoff_multiplier, reset_backoff_threshold_ms, 0, 3
        ),
        clock,
    )
    # Test the merging logic works well after a series of resetting.
    for _ in range(10):
        # All exceptions merged into one attempt if the time is same.
        current_backoff_ms = initial_backoff_ms
        check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

        # After advance time it's a new round, so new exception will be a new attempt.
        clock.advance_time(1)
        current_backoff_ms = int(current_backoff_ms * backoff_multiplier)
        check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

        # After advance time it's a new round, so new exception will be a new attempt.
        clock.advance_time(1)
        current_backoff_ms = max_backoff_ms
        check_multiple_exceptions_are_merged(clock, current_backoff_ms, strategy)

        # After resetBackoffThresholdMS, the restartStrategy should be reset.
        clock.advance_time(reset_backoff_threshold_ms)


def test_exponential_a_failure_at_the_instant_of_the_restart_is_merged():
    """Ports ExponentialDelayRestartBackoffTimeStrategy.notifyFailure's `now <=
    nextRestartTimestamp` at its edge (checkMultipleExceptionsAreMerged stops 1 ms short)."""
    clock = ManualClock()
    strategy = Strategy(exponential(10, 100, 2.0, 1000, 0), clock)
    assert strategy.notify_failure()
    clock.advance_time(10)
    assert not strategy.notify_failure()
    assert strategy.get_backoff_time() == 0
    clock.advance_time(1)
    assert strategy.notify_failure()
    assert strategy.get_backoff_time() == 20


def test_exponential_at_the_maximum_the_delay_is_the_maximum():
    """Ports ExponentialDelayRestartBackoffTimeStrategy.calculateActualBackoffTime: the
    jitter is added to the uncapped backoff, then capped; with Flink's defaults (1 s to 60 s,
    x1.5, jitter 0.1) the 12th backoff, 86.5 s - 10 %, is above the maximum already. Flink's
    long arithmetic wraps past 2^63 ms (from the 92nd restart here), and a positive jitter
    then gives the initial backoff; ours stays at the maximum."""
    for seed in range(5):
        clock = ManualClock()
        strategy = Strategy(ExponentialDelay(), clock, seed=str(seed))
        backoffs = []
        for _ in range(120):
            clock.advance_time(61_000)  # after the restart, well within the reset threshold
            assert strategy.notify_failure()
            backoffs.append(strategy.get_backoff_time())
        assert 1000 <= backoffs[0] <= 1100
        assert all(b == 60_000 for b in backoffs[11:])


# -- RestartStrategyOptions: the defaults --------------------------------------------------------


def test_the_defaults_are_flink_s():
    """Ports Flink 1.20's RestartStrategyOptions defaults (restart-strategy.*), and the default
    strategy with checkpointing enabled: exponential-delay."""
    assert FixedDelay() == FixedDelay(attempts=1, delay_seconds=1)
    assert FailureRate() == FailureRate(max_failures=1, interval_seconds=60, delay_seconds=1)
    assert ExponentialDelay() == ExponentialDelay(
        initial_backoff_seconds=1,
        max_backoff_seconds=60,
        multiplier=1.5,
        jitter=0.1,
        reset_after_seconds=3600,
        max_attempts=None,  # attempts-before-reset-backoff: infinite
    )
    spec = valid_spec()
    spec.pop("restart_policy", None)
    known = {"events": "kafka", "warehouse": "postgres"}
    assert parse_spec(spec, connections=known).restart_policy == ExponentialDelay()


# -- Flink's checks on the settings, as refusals -------------------------------------------------


@pytest.mark.parametrize("multiplier", [1, 1.0, 0.5, 0])
def test_a_multiplier_of_one_or_less_is_refused_through_the_api(
    api, kafka_connection, postgres_connection, multiplier
):
    """Ports ExponentialDelayRestartBackoffTimeStrategy's checkArgument(backoffMultiplier > 1,
    "Backoff multiplier must be greater than 1.")."""
    spec = valid_spec(restart_policy={"kind": "exponential-delay", "multiplier": multiplier})
    response = api.post("/api/pipelines/", {"name": "orders", "spec": spec}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["spec.restart_policy.multiplier"] == [
        f"must be greater than 1, got {multiplier:g}"
    ]
    assert not Pipeline.objects.filter(name="orders").exists()


def test_a_multiplier_of_one_is_refused_on_change_and_the_pipeline_is_kept(api, pipeline):
    response = api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "exponential-delay", "multiplier": 1}}},
        format="json",
    )
    assert response.status_code == 400
    assert list(response.json()) == ["spec.restart_policy.multiplier"]
    stored = Pipeline.objects.get(name="orders")
    assert (stored.version, stored.spec["restart_policy"]) == (
        1,
        pipeline["spec"]["restart_policy"],
    )
    accepted = api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "exponential-delay", "multiplier": 1.01}}},
        format="json",
    )
    assert accepted.status_code == 200, accepted.json()
    assert accepted.json()["spec"]["restart_policy"]["multiplier"] == 1.01


@pytest.fixture
def editor(django_user_model) -> Client:
    user = django_user_model.objects.create_user(username="ed")
    set_role(user, "editor")
    client = Client()
    client.force_login(user)
    return client


def test_the_form_shows_the_multiplier_refusal_at_its_input(
    editor, kafka_connection, postgres_connection
):
    post = {
        "name": "payments",
        "source_connection": "events",
        "topics": "payments",
        "schema": "id STRING, amount DOUBLE",
        "starting_offsets": "earliest",
        "max_records_per_batch": "1000",
        "fail_on_data_loss": "on",
        "reader": "python",
        "transform_sql": "SELECT id, amount FROM source",
        "sink_connection": "warehouse",
        "table": "payments",
        "mode": "append",
        "interval_seconds": "2",
        "restart_kind": "exponential-delay",
        "restart_exponential-delay_multiplier": "1",
    }
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400  # shown again, with the problem at its input
    html = response.content.decode()
    errors = re.search(
        r'<ul class="field-errors" id="e-restart_exponential-delay_multiplier">(.*?)</ul>',
        html,
        re.S,
    )
    assert errors and "must be greater than 1, got 1" in errors.group(1)
    assert not Pipeline.objects.filter(name="payments").exists()
