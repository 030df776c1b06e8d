"""On-call controls through the REST API: what each does, that each is audited, and 409s.

Drivers are real processes under the real supervisor, stand-ins for spark-submit
(tests/drivers/standin.py): in "silent" mode one runs until stopped (stop file) or killed.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from controlplane.definitions.models import AuditEntry, Run, RunState
from controlplane.supervision import launcher, reconciler
from tests.runs import orders, step, until_it_ends
from tests.waiting import wait_until


def post(api, action, reason=None):
    body = {"reason": reason} if reason is not None else {}
    return api.post(f"/api/pipelines/orders/{action}/", body, format="json")


def running(api):
    """Start the pipeline and reconcile until its driver runs; returns the run."""
    assert post(api, "start", "first start").status_code == 202
    assert step(timezone.now()) == "start"
    return Run.objects.get(pipeline=orders(), state=RunState.RUNNING)


def test_every_action_is_audited_with_who_why_and_the_state_before_and_after(api, user, silent):
    run = running(api)
    response = post(api, "suspend", "Kafka maintenance until 04:00")
    assert response.status_code == 202
    assert response.json()["desired_state"] == "suspended"
    entry = AuditEntry.objects.filter(action="suspend").get()
    assert (entry.actor_name, entry.pipeline_name, entry.reason) == (
        user.username,
        "orders",
        "Kafka maintenance until 04:00",
    )
    assert entry.before["desired_state"] == "running"
    assert entry.after["desired_state"] == "suspended"

    log = api.get("/api/audit/?pipeline=orders").json()["results"]
    assert [e["action"] for e in log] == ["suspend", "start", "create"]
    assert log[0]["actor"] == user.username
    assert api.get("/api/audit/?actor=somebody-else").json()["results"] == []
    assert api.get("/api/audit/?pipeline=other").json()["results"] == []
    launcher.kill(run)


def test_suspend_stops_gracefully_and_holds_until_resumed(api, silent):
    run = running(api)
    post(api, "suspend")
    step(timezone.now())  # asks the driver to stop (stop file)
    wait_until(lambda: step(timezone.now()) == "stopped", 20, "the graceful stop")
    run.refresh_from_db()
    assert (run.cause, run.exit_code) == ("stopped", 0)
    assert orders().status == "suspended"
    assert step(timezone.now() + timedelta(hours=1)) is None  # held: nothing restarts it
    assert post(api, "resume", "maintenance over").json()["desired_state"] == "running"
    assert step(timezone.now()) == "start"
    launcher.kill(Run.objects.get(pipeline=orders(), state=RunState.RUNNING))


def test_kill_ends_the_driver_at_once(api, silent):
    run = running(api)
    response = post(api, "kill", "runaway job")
    assert response.status_code == 202
    assert response.json()["status"] == "stopped"
    run.refresh_from_db()
    assert (run.state, run.cause, run.exit_code) == ("exited", "killed", -9)
    assert "runaway job" in run.error_tail
    wait_until(lambda: launcher.alive(run) is False, 20, "the process tree to die")
    assert post(api, "kill").status_code == 202  # again: nothing left to kill, still fine


def test_restart_replaces_the_driver_with_a_new_generation(api, silent):
    first = running(api)
    assert post(api, "restart", "pick up new config").json()["status"] == "restarting"
    wait_until(lambda: step(timezone.now()) == "start", 20, "the new driver")
    first.refresh_from_db()
    assert (first.state, first.exit_code) == ("exited", 0)  # stopped gracefully first
    second = Run.objects.get(pipeline=orders(), state=RunState.RUNNING)
    assert second.generation > first.generation
    assert orders().status == "running"
    launcher.kill(second)


def test_restart_now_skips_a_pending_backoff_and_reset_restarts_counts_afresh(api, standin):
    api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "fixed-delay", "attempts": 5, "delay_seconds": 600}}},
        format="json",
    )
    post(api, "start")
    t = timezone.now()
    step(t)
    until_it_ends(t)
    assert orders().status == "backing-off"
    assert post(api, "restart-now", "do not wait 10 minutes").status_code == 202
    assert orders().next_attempt_at <= timezone.now()
    assert step(timezone.now()) == "start"
    until_it_ends(timezone.now())
    assert orders().attempt == 2
    assert post(api, "reset-restarts").json()["attempt"] == 0


def test_actions_that_do_not_apply_are_refused_with_409_and_bad_input_with_400(api, pipeline):
    response = post(api, "resume")
    assert response.status_code == 409
    assert response.json()["detail"] == "pipeline 'orders' is stopped, not suspended: start it"
    response = post(api, "restart-now")
    assert response.status_code == 409
    assert "has no restart pending (it is stopped)" in response.json()["detail"]
    response = api.post("/api/pipelines/orders/stop/", {"reason": ["x"]}, format="json")
    assert response.status_code == 400
    assert "reason" in response.json()
    response = api.post("/api/pipelines/orders/stop/", {"reason": "x" * 2001}, format="json")
    assert response.status_code == 400
    # Refused actions change and record nothing (the pipeline's creation is all there is).
    assert list(
        AuditEntry.objects.filter(pipeline_name="orders").values_list("action", flat=True)
    ) == ["create"]


def test_runs_and_failures_are_listed_newest_first(api, standin):
    api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "fixed-delay", "attempts": 1, "delay_seconds": 0}}},
        format="json",
    )
    post(api, "start")
    t = timezone.now()
    step(t)
    assert until_it_ends(t) == "crashed, start"  # a delay of 0: restarted in the same step
    assert until_it_ends(t) == "crashed"  # the second failure: the policy gives up
    runs = api.get("/api/pipelines/orders/runs/").json()["results"]
    assert [(r["generation"], r["cause"], r["exit_code"]) for r in runs] == [
        (2, "crashed", 1),
        (1, "crashed", 1),
    ]
    assert "OutOfMemoryError" in runs[0]["error_tail"]
    failures = api.get("/api/pipelines/orders/failures/").json()["results"]
    assert [f["run"] for f in failures] == [2, 1]
    assert failures[0]["decision"].startswith("gave up: 2 failures since the last start")
    assert failures[1]["decision"].startswith("restart 1 of 1")
    assert reconciler  # the module drives these runs through step()


def test_changing_the_desired_state_or_spec_through_put_or_patch_is_audited_too(
    api, user, pipeline
):
    response = api.patch("/api/pipelines/orders/", {"desired_state": "suspended"}, format="json")
    assert response.status_code == 200
    entry = AuditEntry.objects.filter(pipeline_name="orders").exclude(action="create").get()
    assert (entry.action, entry.actor_name) == ("update", user.username)
    assert (entry.before["desired_state"], entry.after["desired_state"]) == ("stopped", "suspended")
    api.patch("/api/pipelines/orders/", {"description": "same spec, new words"}, format="json")
    tracked = AuditEntry.objects.filter(pipeline_name="orders").exclude(action="create")
    assert tracked.count() == 1  # nothing the audit log tracks changed
