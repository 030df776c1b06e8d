"""Supervision faults found in review (security issue #12): a kill while a driver is being
launched, deleting a pipeline with a live run, the lock order of exit reports and ticks,
fencing of exit reports, runs on another host, and process identity (pid and start time).

Drivers are real processes under the real supervisor, stand-ins for spark-submit
(tests/drivers/standin.py), as in test_supervision.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from django.db import connection, transaction
from django.utils import timezone

from controlplane.accounts.models import digest
from controlplane.definitions.models import AuditEntry, Pipeline, Run, RunState
from controlplane.supervision import launcher, reconciler, tasks
from jobs.reporting import Reporter
from tests.clients import driver
from tests.runs import orders, step
from tests.waiting import wait_for


def processes_of(run_dir: str) -> list[int]:
    """Live processes whose command line names the run's directory (supervisor, driver)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if run_dir in (process.info["cmdline"] or []):
            found.append(process.pid)
    return found


# --- 1. a kill while the driver is being launched ------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_kill_while_the_driver_is_being_launched_leaves_no_driver(api, silent):
    """The launch runs outside the pipeline's lock. An operator's kill lands after the
    supervisor was started and before the launch records it: the launch finds its run
    ended, kills the driver it started, and no process of the run survives."""
    seen = {}

    def slow_run(command, **kwargs):
        # Before any process exists, the run row (token digest, directory, host) is
        # committed: another connection sees it.
        def look():
            seen["row"] = Run.objects.filter(pipeline__name="orders").values().get()
            connection.close()

        reader = threading.Thread(target=look)
        reader.start()
        reader.join()
        result = subprocess.run(command, **kwargs)
        seen["pid"] = int(result.stdout)
        # The operator's kill, from another request, while the launch is in progress.
        killer = threading.Thread(target=kill_now)
        killer.start()
        killer.join()
        return result

    def kill_now():
        seen["kill"] = api.post("/api/pipelines/orders/kill/", {"reason": "t"}, format="json")
        connection.close()

    # The supervisor is started by the launcher's subprocess.run: slowed down here.
    silent.setattr(launcher, "subprocess", SimpleNamespace(run=slow_run))
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    assert step(timezone.now()) == "launch-aborted"

    row = seen["row"]
    assert row["state"] == "starting" and row["pid"] is None
    assert row["token_digest"] and row["run_dir"] and row["host"] == socket.gethostname()
    assert seen["kill"].status_code == 202
    run = Run.objects.get(pipeline__name="orders")
    assert (run.state, run.cause, run.pid) == ("exited", "killed", seen["pid"])
    assert "was killed" in run.error_tail
    assert wait_for(lambda: not processes_of(run.run_dir), timeout=10), processes_of(run.run_dir)
    assert launcher.alive(run) is False
    p = orders()
    assert (p.desired_state, p.status) == ("stopped", "stopped")

    # Such a driver's reports are refused as stale (409: stop), not as unknown (401).
    token = json.loads(Path(run.run_dir, "run.json").read_text())["control_plane"]["token"]
    response = driver(token).post(f"/api/runs/{run.pk}/heartbeat/")
    assert response.status_code == 409
    assert response.json()["stop"] is True


def test_a_launch_lost_with_its_driver_running_kills_that_driver(api, silent):
    """The worker died after starting the supervisor, before recording its pid: when the
    run is given up on as lost, what it started is found by its run directory and killed."""

    def start_then_die(command, **kwargs):
        subprocess.run(command, **kwargs)  # the supervisor starts, detached
        raise SystemExit("the worker died")  # not an Exception: nothing records the launch

    silent.setattr(launcher, "subprocess", SimpleNamespace(run=start_then_die))
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    t = timezone.now()
    with pytest.raises(SystemExit):
        step(t)
    run = Run.objects.get(pipeline__name="orders")
    assert (run.state, run.pid) == ("starting", None)
    assert wait_for(lambda: len(processes_of(run.run_dir)) >= 2)  # supervisor and driver
    assert step(t + reconciler.LAUNCH_GRACE + timedelta(seconds=1)) == "launch-lost"
    assert wait_for(lambda: not processes_of(run.run_dir), timeout=10), processes_of(run.run_dir)


@pytest.mark.parametrize("code", [401, 404, 409])
def test_a_driver_whose_reports_are_refused_as_not_current_stops_itself(code):
    class Answer:
        status_code = code
        text = "refused"

        def json(self):
            return {"detail": "refused"}

    class Session:
        headers: dict = {}

        def post(self, *args, **kwargs):
            return Answer()

    stops = []
    reporter = Reporter("http://cp", 1, "tok", on_stop=stops.append, session=Session())
    assert reporter._send("heartbeat", {}) is True
    assert len(stops) == 1 and str(code) in stops[0]


def test_a_refused_driver_stops_its_query_at_once_and_an_asked_one_after_its_batch(tmp_path):
    """Refused (another run may own the pipeline): the kill file, which stops the query now;
    asked to stop by the control plane: the stop file, after the batch in flight (under a
    backlog, "after the batch in flight" would be batch after batch by a fenced driver)."""
    from jobs.run import KILL_FILE, STOP_FILE, start_reporter

    cp = {"url": "http://127.0.0.1:9", "run_id": 1, "token": "t", "heartbeat_seconds": 60}
    reporter = start_reporter(cp, tmp_path)
    try:
        reporter.on_stop("the control plane asked for a stop")
        assert (tmp_path / STOP_FILE).exists() and not (tmp_path / KILL_FILE).exists()
        reporter.on_refused("the control plane refused this run (409)")
        assert (tmp_path / KILL_FILE).exists()
    finally:
        reporter.close(timeout=1)


# --- 2. deleting a pipeline ----------------------------------------------------------------


def test_a_pipeline_with_an_active_run_is_not_deleted_even_if_it_looks_stopped(api, pipeline):
    p = Pipeline.objects.get(name="orders")
    Run.objects.create(pipeline=p, generation=1, spec_version=1, state="stopping")
    response = api.delete("/api/pipelines/orders/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "pipeline 'orders' is stopped (desired stopped, run 1 stopping); "
        "stop it and let its driver exit before deleting it"
    )
    assert Run.objects.filter(pipeline=p, state="stopping").exists()


def test_deleting_a_pipeline_is_audited(api, pipeline, user):
    assert api.delete("/api/pipelines/orders/").status_code == 204
    entry = AuditEntry.objects.get(action="delete")
    assert (entry.pipeline_name, entry.actor_name, entry.pipeline) == ("orders", "oncall", None)
    assert entry.before["status"] == "stopped" and entry.after == {}


@pytest.mark.django_db(transaction=True)
def test_delete_waits_for_the_pipeline_lock_and_sees_the_run_started_under_it(api, pipeline):
    """A run created under the pipeline's lock (as the reconciler does) while a delete
    comes in: the delete waits for the lock and then refuses; it never drops the run."""
    locked = threading.Event()

    def reconcile_like():
        with transaction.atomic():
            p = Pipeline.objects.select_for_update().get(name="orders")
            locked.set()
            Run.objects.create(pipeline=p, generation=1, spec_version=1, state="starting")
            Pipeline.objects.filter(pk=p.pk).update(generation=1, status="starting")
            time.sleep(0.5)
        connection.close()

    holder = threading.Thread(target=reconcile_like)
    holder.start()
    assert locked.wait(10)
    response = api.delete("/api/pipelines/orders/")
    holder.join()
    assert response.status_code == 409, response.content
    assert "run 1 starting" in response.json()["detail"]
    assert Run.objects.filter(pipeline__name="orders", state="starting").exists()


def test_the_admin_refuses_to_delete_a_pipeline_with_a_run(admin_client, pipeline):
    p = Pipeline.objects.get(name="orders")
    run = Run.objects.create(pipeline=p, generation=1, spec_version=1, state="running")
    url = f"/admin/pipelines/pipeline/{p.pk}/delete/"
    response = admin_client.post(url, {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Not deleted: pipeline &#x27;orders&#x27; is stopped" in response.content.decode()
    assert Pipeline.objects.filter(pk=p.pk).exists()
    assert "delete_selected" not in admin_client.get("/admin/pipelines/pipeline/").content.decode()

    Run.objects.filter(pk=run.pk).update(state="exited")
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert not Pipeline.objects.filter(pk=p.pk).exists()
    assert AuditEntry.objects.get(action="delete").reason == "deleted in the admin"


# --- 3. one lock order: exit reports against ticks -------------------------------------------


ROUNDS = 200


@pytest.mark.django_db(transaction=True)
def test_exit_reports_and_ticks_at_once_never_deadlock(api, pipeline, monkeypatch):
    """Each round a run ends two ways at once: its supervisor's exit report (the real API
    view, with the run token) and a tick that finds its heartbeat overdue. One of them
    records the end; neither fails, and no run is left active."""
    monkeypatch.setattr(tasks.reconcile_pipeline, "delay", lambda *args: None)
    api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "fixed-delay", "attempts": 9, "delay_seconds": 3600}}},
        format="json",
    )
    p = Pipeline.objects.get(name="orders")
    long_ago = timezone.now() - timedelta(hours=1)
    outcomes = {"exit": {}, "tick": {}}
    for generation in range(1, ROUNDS + 1):
        Pipeline.objects.filter(pk=p.pk).update(
            generation=generation,
            desired_state="running",
            status="running",
            next_attempt_at=None,
            attempt=0,
            restarts_since=timezone.now(),
        )
        run = Run.objects.create(
            pipeline=p,
            generation=generation,
            spec_version=p.version,
            state="running",
            host=socket.gethostname(),
            token_digest=digest(f"tok-{generation}"),
            started_at=long_ago,
            last_heartbeat_at=long_ago,
        )
        barrier = threading.Barrier(2)
        results = {}

        def exit_report(run=run, generation=generation, barrier=barrier, results=results):
            try:
                barrier.wait(10)
                results["exit"] = (
                    driver(f"tok-{generation}")
                    .post(
                        f"/api/runs/{run.pk}/exit/",
                        {"exit_code": 1, "error_tail": "boom"},
                        format="json",
                    )
                    .status_code
                )
            finally:
                connection.close()

        def tick(barrier=barrier, results=results):
            try:
                barrier.wait(10)
                results["tick"] = reconciler.tick(timezone.now())
            finally:
                connection.close()

        threads = [threading.Thread(target=exit_report), threading.Thread(target=tick)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(t.is_alive() for t in threads), f"round {generation}: stuck"
        assert results.get("exit") in (200, 409), (generation, results)
        action = results["tick"]["actions"].get("orders")
        assert action in (None, "lost-heartbeat"), (generation, results)
        run.refresh_from_db()
        assert run.state == RunState.EXITED, (generation, run.state)
        outcomes["exit"][results["exit"]] = outcomes["exit"].get(results["exit"], 0) + 1
        outcomes["tick"][action] = outcomes["tick"].get(action, 0) + 1
    assert not Run.objects.filter(state__in=RunState.active()).exists()
    print("outcomes", outcomes)


# --- 4. exit reports are fenced ------------------------------------------------------------


def test_an_exit_report_of_a_stale_run_is_refused(running):
    Pipeline.objects.filter(pk=running.pipeline_id).update(generation=2)
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/exit/", {"exit_code": 1, "error_tail": "x"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["stop"] is True
    running.refresh_from_db()
    assert running.state == "running"  # the reconciler reads its exit.json instead


def test_an_exit_report_of_an_ended_run_is_refused(running):
    Run.objects.filter(pk=running.pk).update(state="exited", cause="killed")
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/exit/", {"exit_code": 0, "error_tail": ""}, format="json"
    )
    assert response.status_code == 409
    running.refresh_from_db()
    assert running.cause == "killed"


def test_the_current_run_s_exit_report_is_recorded(running, monkeypatch):
    monkeypatch.setattr(tasks.reconcile_pipeline, "delay", lambda *args: None)
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/exit/", {"exit_code": 1, "error_tail": "x"}, format="json"
    )
    assert (response.status_code, response.json()) == (200, {"recorded": True})
    running.refresh_from_db()
    assert (running.state, running.cause) == ("exited", "crashed")


# --- 5. a run on another host: tests/test_hosts.py ---------------------------------------


# --- 6. process identity: pid and start time -----------------------------------------------


@pytest.fixture
def bystander():
    """An unrelated process leading a process group of its own, as a process that got a
    recorded pid after a reboot would be."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    yield process
    process.kill()
    process.wait()


def test_a_pid_that_is_now_another_process_is_neither_alive_nor_killed(bystander):
    started = psutil.Process(bystander.pid).create_time()
    stale = Run(pid=bystander.pid, host=socket.gethostname(), process_started=started - 3600)
    assert launcher.alive(stale) is False
    launcher.kill(stale)
    time.sleep(0.2)
    assert bystander.poll() is None  # not killed: it is not the run's supervisor

    ours = Run(pid=bystander.pid, host=socket.gethostname(), process_started=started)
    assert launcher.alive(ours) is True
    launcher.kill(ours)
    assert bystander.wait(10) == -9


def test_the_launch_records_the_supervisor_s_start_time(api, silent):
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    assert step(timezone.now()) == "start"
    run = Run.objects.get(pipeline__name="orders")
    assert run.process_started == pytest.approx(psutil.Process(run.pid).create_time(), abs=0.01)
    assert launcher.alive(run) is True
    launcher.kill(run)
    assert wait_for(lambda: launcher.alive(run) is False)
    assert os.path.isdir(run.run_dir)


@pytest.mark.django_db(transaction=True)
def test_a_nudge_waits_for_a_row_the_tick_holds_and_the_tick_passes_over_it(pipeline, monkeypatch):
    """An exit committed while the tick held the pipeline's row was passed over by the nudge
    too (both skipped locked rows), and its restart waited for the next tick."""
    from controlplane.definitions.models import DesiredState, Status

    Pipeline.objects.filter(name="orders").update(
        status=Status.BACKING_OFF, desired_state=DesiredState.STOPPED
    )
    pk = orders().pk
    held, release = threading.Event(), threading.Event()

    def hold_the_row():
        with transaction.atomic():
            Pipeline.objects.select_for_update().get(pk=pk)
            held.set()
            release.wait(10)
        connection.close()

    def holding(seconds: float) -> threading.Thread:
        held.clear()
        release.clear()
        holder = threading.Thread(target=hold_the_row)
        holder.start()
        assert held.wait(10)
        threading.Timer(seconds, release.set).start()
        return holder

    holder = holding(0.5)
    assert reconciler.reconcile_pipeline(pk, timezone.now()) is None  # the tick: passes over
    started = time.monotonic()
    assert reconciler.reconcile_pipeline(pk, timezone.now(), wait=True) == "settle"
    assert time.monotonic() - started >= 0.3  # it waited for the holder
    assert orders().status == Status.STOPPED
    holder.join()

    # A row held longer than NUDGE_LOCK_WAIT: left to the tick, nothing changed meanwhile.
    Pipeline.objects.filter(pk=pk).update(status=Status.BACKING_OFF)
    monkeypatch.setattr(reconciler, "NUDGE_LOCK_WAIT", 0.2)
    holder = holding(1.5)
    assert reconciler.reconcile_pipeline(pk, timezone.now(), wait=True) is None
    assert orders().status == Status.BACKING_OFF
    holder.join()
    assert reconciler.reconcile_pipeline(pk, timezone.now(), wait=True) == "settle"
