"""Supervision: failures are detected, recorded, and restarted per the pipeline's policy.

The driver is a real process under the real supervisor, but a stand-in for spark-submit
(tests/drivers/standin.py) so that a test can go through many runs in seconds; the clock
the reconciler is given is the test's. Real Spark drivers being killed and restarted are in
test_launch_and_stop.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.definitions.models import Failure, Pipeline, Run, RunState
from controlplane.supervision import launcher
from tests import conftest
from tests.runs import orders, seconds, start, step, until_it_ends
from tests.waiting import wait_for, wait_until

# The `standin` fixture is in conftest.py; tests/api/test_exit_failures.py still imports it
# (with orders, start and step, now in tests/runs.py) from here.
standin = conftest.standin


def test_fixed_delay_restarts_after_its_delay_and_gives_up_after_its_attempts(api, standin):
    t = start(api, {"kind": "fixed-delay", "attempts": 2, "delay_seconds": 10})
    assert step(t) == "start"
    assert until_it_ends(t) == "crashed"
    p = orders()
    assert (p.status, p.next_attempt_at, p.attempt) == ("backing-off", t + seconds(10), 1)
    assert step(t + seconds(9)) is None  # not yet due: nothing happens
    assert step(t + seconds(10)) == "start"
    assert orders().restarts == 1
    until_it_ends(t + seconds(11))
    assert step(t + seconds(21)) == "start"
    until_it_ends(t + seconds(22))
    p = orders()
    assert (p.status, p.next_attempt_at, p.restarts) == ("failed", None, 2)
    assert p.failures.first().decision == (
        "gave up: 3 failures since the last start exceed fixed-delay(attempts 2, delay 10 s)"
    )
    assert step(t + seconds(100)) is None  # a failed pipeline stays down
    assert Run.objects.filter(pipeline=p).count() == 3

    # A start by hand counts failures afresh (it happens at t + 50 on the test's clock).
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    assert orders().restarts_since is not None
    Pipeline.objects.filter(name="orders").update(restarts_since=t + seconds(50))
    later = t + seconds(50)
    assert step(later) == "start"
    until_it_ends(later)
    assert orders().status == "backing-off"


def test_a_restart_with_no_delay_is_launched_in_the_step_that_sees_the_exit(api, standin):
    """Whoever sees the exit first (the tick, before the driver's report arrives) restarts a
    policy due at once: not a tick later."""
    t = start(api, {"kind": "fixed-delay", "attempts": 2, "delay_seconds": 0})
    assert step(t) == "start"
    for generation in (2, 3):
        action = wait_until(lambda: step(t), 30, "the step that sees the exit")
        assert action == "crashed, start"
        run = Run.objects.get(pipeline=orders(), state__in=RunState.active())
        assert run.generation == generation
        assert orders().restarts == generation - 1
    assert until_it_ends(t) == "crashed"  # the third failure: the policy gives up
    assert orders().status == "failed"
    assert not Run.objects.filter(pipeline=orders(), state__in=RunState.active()).exists()


def test_exponential_delay_waits_longer_after_each_failure(api, standin):
    t = start(
        api,
        {
            "kind": "exponential-delay",
            "initial_backoff_seconds": 4,
            "multiplier": 2,
            "max_backoff_seconds": 100,
            "jitter": 0,
        },
    )
    step(t)
    until_it_ends(t)
    due = []
    for _ in range(3):
        p = orders()
        due.append((p.next_attempt_at - t).total_seconds())
        assert step(p.next_attempt_at - seconds(0.5)) is None
        assert step(p.next_attempt_at) == "start"
        until_it_ends(p.next_attempt_at)
    assert due == [4, 4 + 8, 4 + 8 + 16]
    assert orders().attempt == 4


def test_failure_rate_gives_up_when_its_rate_is_exceeded(api, standin):
    t = start(
        api, {"kind": "failure-rate", "max_failures": 2, "interval_seconds": 60, "delay_seconds": 1}
    )
    step(t)
    until_it_ends(t)
    for n in (1, 2):
        assert step(t + seconds(n)) == "start"
        until_it_ends(t + seconds(n))
    p = orders()
    assert p.status == "failed"
    assert p.failures.first().decision == (
        "gave up: 3 failures in 60 s exceed failure-rate(max 2 per 60 s, delay 1 s)"
    )


def test_a_definition_error_is_not_restarted(api, standin):
    standin.setenv(
        "STANDIN_ERROR",
        "pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION]"
        " A column, variable, or function parameter with name `amout` cannot be resolved.",
    )
    t = start(api, {"kind": "exponential-delay"})  # would restart forever
    step(t)
    until_it_ends(t)
    p = orders()
    assert p.status == "failed"
    failure = Failure.objects.get(pipeline=p)
    assert failure.permanent
    assert "UNRESOLVED_COLUMN" in failure.message
    assert failure.decision.startswith("gave up: a definition error")
    body = api.get("/api/pipelines/orders/").json()
    assert body["last_failure"]["cause"] == "crashed"
    assert body["last_failure"]["decision"] == failure.decision


def test_a_run_that_stops_heartbeating_is_killed_and_restarted(api, standin, settings, listening):
    standin.setenv("STANDIN_MODE", "silent")
    settings.CONTROLPLANE_STARTUP_GRACE = 5
    t = start(api, {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 2})
    assert step(t) == "start"
    run = Run.objects.get(pipeline=orders())
    assert step(t + seconds(4)) is None  # still within its start-up grace
    assert step(t + seconds(6)) == "lost-heartbeat"
    run.refresh_from_db()
    assert (run.state, run.cause) == ("exited", "lost-heartbeat")
    assert "no heartbeat within 5 s" in run.error_tail
    wait_for(lambda: not launcher.alive(run), 10, every=0.1)
    assert launcher.alive(run) is False  # killed, not left running beside its successor
    assert orders().status == "backing-off"


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_reports_the_exit_itself_at_once(api, standin, settings, live_server):
    settings.CONTROLPLANE_URL = live_server.url
    t = start(api, {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 30})
    assert step(t) == "start"
    run = Run.objects.get(pipeline=orders())
    # No tick from here on: only the supervisor's own report can end the run.
    wait_for(lambda: Run.objects.get(pk=run.pk).state == "exited", 10)
    run.refresh_from_db()
    assert (run.state, run.cause, run.exit_code) == ("exited", "crashed", 1)
    assert "OutOfMemoryError" in run.error_tail
    assert json.loads((Path(run.run_dir) / "exit.json").read_text())["exit_code"] == 1
    assert orders().status == "backing-off"


def test_a_run_that_heartbeats_but_completes_no_batch_is_stalled(api, standin, settings, listening):
    """Alive and heartbeating, but no batch and no idle report for the window: stuck."""
    standin.setenv("STANDIN_MODE", "silent")
    t = start(api, {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 2})
    assert step(t) == "start"
    run = Run.objects.get(pipeline=orders())

    def reports(at, **changes):  # what the driver's reporter would have sent by then
        Run.objects.filter(pk=run.pk).update(last_heartbeat_at=at, **changes)

    reports(t + seconds(5), last_batch_at=t + seconds(5))
    reports(t + seconds(60), last_idle_at=t + seconds(40))  # idle: waiting for data
    assert step(t + seconds(61)) is None
    reports(t + seconds(100))  # heartbeats go on; no batch, no idle wait since t + 40
    assert step(t + seconds(100)) is None  # exactly the window: not yet
    assert step(t + seconds(101)) == "stalled"
    run.refresh_from_db()
    assert (run.state, run.cause) == ("exited", "stalled")
    assert run.error_tail == "no batch completed for 61 s with records to read (window 60 s)"
    assert orders().status == "backing-off"
