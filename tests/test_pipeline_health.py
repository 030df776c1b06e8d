"""A pipeline's health in one word (controlplane.observability.health): pure, time passed in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.observability import health
from controlplane.observability.health import Facts, Policy, judge

NOW = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def running(**facts) -> Facts:
    return Facts(**{"status": "running", "wanted_running": True, **facts})


def test_a_member_restarted_after_every_failure_is_crash_looping_though_running():
    """The shared application's member that fails every batch: restarted in 1-2 s, so its
    status reads `running`; three failures in ten minutes, never committed since: red."""
    facts = running(
        failures=(ago(200), ago(100), ago(5)),
        run_started_at=ago(3),
        last_commit_at=None,
        lag_records=10,
        last_cause='column "courier_id" named in key does not exist',
    )
    found = judge(facts, NOW)
    assert (found.state, found.colour) == (health.CRASH_LOOPING, health.RED)
    assert found.why == '3 failures in 10 min: column "courier_id" named in key does not exist'


def test_a_run_that_committed_since_its_start_is_not_crash_looping():
    facts = running(
        failures=(ago(200), ago(100), ago(50)), run_started_at=ago(40), last_commit_at=ago(1)
    )
    assert judge(facts, NOW).state == health.HEALTHY


def test_failures_older_than_the_window_do_not_count():
    facts = running(failures=(ago(1300), ago(1200), ago(5)), run_started_at=ago(3))
    assert judge(facts, NOW).state == health.HEALTHY
    assert judge(facts, NOW, Policy(crash_loop_minutes=30)).state == health.CRASH_LOOPING


def test_a_run_that_commits_nothing_while_records_wait_is_failing():
    facts = running(run_started_at=ago(300), lag_records=5000)
    found = judge(facts, NOW, Policy(grace_seconds=120))
    assert found.state == health.FAILING and "5000 records wait" in found.why
    # Within its start-up grace, or with nothing to read, it is not.
    assert judge(facts, NOW, Policy(grace_seconds=600)).state == health.HEALTHY
    assert judge(running(run_started_at=ago(300), lag_records=0), NOW).state == health.HEALTHY


def test_a_stalled_lag_is_failing_once_past_the_grace():
    facts = running(run_started_at=ago(300), last_commit_at=ago(200), lag_status="stalled")
    assert judge(facts, NOW).state == health.FAILING
    young = running(run_started_at=ago(30), last_commit_at=None, lag_status="stalled")
    assert judge(young, NOW).state == health.LAGGING


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        (Facts(status="failed", wanted_running=True, last_cause="x"), health.FAILED),
        (Facts(status="stopped", wanted_running=False), health.STOPPED),
        (Facts(status="backing-off", wanted_running=True, failures=(ago(5),)), health.RECOVERING),
        (Facts(status="starting", wanted_running=True), health.RECOVERING),
        (running(run_started_at=ago(60), last_commit_at=ago(1)), health.HEALTHY),
        (running(lag_status="lagging"), health.LAGGING),
        (running(lag_error="the broker did not answer"), health.LAGGING),
        (running(backpressure="high"), health.DEGRADED),
        # Low backpressure is no warning.
        (running(backpressure="low"), health.HEALTHY),
    ],
)
def test_each_state(facts, state):
    assert judge(facts, NOW).state == state


def test_a_failed_pipeline_says_why_it_gave_up():
    found = judge(Facts(status="failed", wanted_running=True, last_cause="bad credentials"), NOW)
    assert found.why == "gave up restarting: bad credentials"
    assert found.as_dict()["colour"] == health.RED


def test_states_are_ordered_worst_first():
    assert [judge(f, NOW).severity for f in (
        Facts(status="failed", wanted_running=True),
        running(failures=(ago(3), ago(2), ago(1))),
        running(lag_status="lagging"),
        running(),
        Facts(status="stopped", wanted_running=False),
    )] == sorted(
        judge(f, NOW).severity for f in (
            Facts(status="failed", wanted_running=True),
            running(failures=(ago(3), ago(2), ago(1))),
            running(lag_status="lagging"),
            running(),
            Facts(status="stopped", wanted_running=False),
        )
    )  # fmt: skip
