"""The tick visits only pipelines that may need a step; one it leaves out is at rest.

Each case below is a pipeline in one situation; the test asserts which ones the tick visits,
and that `reconcile_pipeline` itself does nothing to every one it does not visit (so a
situation the selection forgot shows up as a step it would have skipped)."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psutil
import pytest

from controlplane.definitions.models import Pipeline, ReconcilerState, Run
from controlplane.supervision import attention, reconciler, transitions
from controlplane.supervision.transitions import Rest
from tests.factories import valid_spec

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def test_the_transition_table_says_which_idle_pipelines_are_at_rest():
    assert transitions.at_rest("failed", "running") is Rest.ALWAYS
    assert transitions.at_rest("stopped", "stopped") is Rest.UNLESS_RESTART_PENDING
    assert transitions.at_rest("suspended", "suspended") is Rest.UNLESS_RESTART_PENDING
    assert transitions.at_rest("stopped", "running") is Rest.NEVER  # launch
    assert transitions.at_rest("running", "stopped") is Rest.NEVER  # settle to stopped
    assert transitions.at_rest("backing-off", "running") is Rest.NEVER  # its time decides


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def gone_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    started = psutil.Process(process.pid).create_time()
    process.wait()
    return process.pid, started


def make(name: str, *, status="stopped", desired="stopped", spec=None, run=None, **fields):
    pipeline = Pipeline.objects.create(
        name=name,
        spec=spec or valid_spec(),
        status=status,
        desired_state=desired,
        generation=1 if run else 0,
        **fields,
    )
    if run is not None:
        Run.objects.create(pipeline=pipeline, generation=1, spec_version=1, **run)
    return pipeline


def snapshot(pipeline: Pipeline):
    rows = Pipeline.objects.filter(pk=pipeline.pk).values().first()
    runs = list(Run.objects.filter(pipeline=pipeline).order_by("pk").values())
    return rows, runs


def test_only_pipelines_that_may_need_a_step_are_visited(db, settings, sleeper, gone_pid, tmp_path):
    settings.CONTROLPLANE_HEARTBEAT_TIMEOUT = 30
    settings.CONTROLPLANE_STARTUP_GRACE = 60
    settings.CONTROLPLANE_STALL_SECONDS = 60
    ReconcilerState.objects.create(id=1, last_tick_at=NOW - timedelta(seconds=5))
    here = socket.gethostname()
    alive = {"pid": sleeper.pid, "process_started": psutil.Process(sleeper.pid).create_time()}
    fresh = {
        "state": "running",
        "host": here,
        **alive,
        "started_at": NOW - timedelta(minutes=10),
        "last_heartbeat_at": NOW - timedelta(seconds=5),
        "last_batch_at": NOW - timedelta(seconds=5),
    }
    running = {"status": "running", "desired": "running"}
    exited = tmp_path / "exited"
    exited.mkdir()
    (exited / "exit.json").write_text('{"exit_code": 1, "error_tail": "boom"}')
    old = NOW - timedelta(minutes=5)
    cases = {
        # -- no active run
        "rest-stopped": (False, {}),
        "rest-suspended": (False, {"status": "suspended", "desired": "suspended"}),
        "rest-failed": (False, {"status": "failed", "desired": "running"}),
        "stale-restart-time": (True, {"next_attempt_at": NOW - timedelta(hours=1)}),
        "wants-to-run": (True, {"desired": "running"}),
        "backing-off-waits": (
            False,
            {"status": "backing-off", "desired": "running", "next_attempt_at": NOW + timedelta(1)},
        ),
        "backing-off-due": (
            True,
            {"status": "backing-off", "desired": "running", "next_attempt_at": NOW},
        ),
        "looks-alive-without-run": (True, running),
        # -- an active run
        "healthy": (False, {**running, "run": fresh}),
        "healthy-idle": (
            False,
            {**running, "run": {**fresh, "last_batch_at": old, "last_idle_at": NOW}},
        ),
        "healthy-slow-trigger": (
            False,
            {
                **running,
                "spec": valid_spec(trigger={"interval_seconds": 60}),
                "run": {**fresh, "last_batch_at": old},
            },
        ),
        "healthy-no-pid-yet": (False, {**running, "run": {**fresh, "pid": None}}),
        "heartbeat-overdue": (True, {**running, "run": {**fresh, "last_heartbeat_at": old}}),
        "never-heard": (True, {**running, "run": {**fresh, "last_heartbeat_at": None}}),
        "stalled": (True, {**running, "run": {**fresh, "last_batch_at": old}}),
        "supervisor-gone": (
            True,
            {**running, "run": {**fresh, "pid": gone_pid[0], "process_started": gone_pid[1]}},
        ),
        "exit-reported": (True, {**running, "run": {**fresh, "run_dir": str(exited)}}),
        "no-longer-wanted": (True, {"status": "running", "run": fresh}),
        "starting": (True, {**running, "run": {**fresh, "state": "starting"}}),
        "stopping": (True, {**running, "run": {**fresh, "state": "stopping"}}),
        "being-killed": (True, {**running, "run": {**fresh, "kill_requested_at": NOW}}),
        "on-another-host": (True, {**running, "run": {**fresh, "host": "elsewhere.example"}}),
        "with-a-message": (True, {**running, "status_message": "x", "run": fresh}),
    }
    pipelines = {name: make(name, **setup) for name, (_, setup) in cases.items()}
    replaced = make("replaced", **running, run=fresh)
    Pipeline.objects.filter(pk=replaced.pk).update(generation=2)
    pipelines["replaced"] = replaced
    expected = {name for name, (visit, _) in cases.items() if visit} | {"replaced"}

    visited = {name for _, name in attention.pipelines_to_visit(NOW)}

    assert visited == expected
    for name, pipeline in pipelines.items():
        if name in visited:
            continue
        before = snapshot(pipeline)
        assert reconciler.reconcile_pipeline(pipeline.pk, NOW) is None, name
        assert snapshot(pipeline) == before, name


def test_the_tick_says_how_many_it_visited(db, settings):
    make("at-rest")
    make("looks-alive", status="running", desired="stopped")
    summary = reconciler.tick(NOW)
    assert summary == {"pipelines": 2, "visited": 1, "actions": {"looks-alive": "settle"}}
    assert reconciler.tick(NOW)["visited"] == 0
