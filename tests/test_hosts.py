"""Several control-plane hosts, fast: a second host stands in as a `Host` row whose worker is
this test (it switches CONTROLPLANE_HOST_NAME to act as that host). What is sent to a host's
queue is captured at the broker's door (`send_task`); the real thing, two hosts in PID
namespaces with real drivers, is tests/test_two_hosts.py.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from controlplane.definitions.models import Host, Pipeline, Run, SparkApplication
from controlplane.supervision import attention, capacity, hosts, launcher, reconciler
from tests.clients import driver
from tests.runs import orders, step, with_current_run
from tests.waiting import wait_for

T = timezone.now()


def at(seconds: float):
    return T + timedelta(seconds=seconds)


# -- the pure choice ------------------------------------------------------------------------


def load(name, cap, used, seen=0.0):
    return capacity.HostLoad(name, cap, used, None if seen is None else at(seen))


def test_the_next_driver_goes_to_the_least_loaded_live_host_with_room():
    timeout = timedelta(seconds=30)
    hosts_ = [load("a", 3, 1), load("b", 6, 1), load("c", 2, 0, seen=-31)]
    assert capacity.choose(hosts_, T, timeout) == ("b", "")  # 1/6 < 1/3; c is lost
    assert capacity.choose([load("a", 3, 1), load("b", 3, 1)], T, timeout) == ("a", "")
    assert capacity.choose([load("a", 1, 1), load("b", 2, 2)], T, timeout) == (
        None,
        "waiting: every control-plane host is full (3 driver processes on 2 hosts)",
    )
    assert capacity.choose([load("a", 0, 0)], T, timeout)[0] is None  # takes no drivers
    assert capacity.choose([load("b", 3, 0, seen=None)], T, timeout) == (
        None,
        "waiting: no control-plane host is alive",
    )
    assert capacity.lost(at(-30), T, timeout) is False
    assert capacity.lost(at(-30.5), T, timeout) is True


# -- a stand-in second host -----------------------------------------------------------------


@pytest.fixture
def sent(monkeypatch):
    """What is sent to hosts' queues: (task, queue, args, kwargs)."""
    out = []

    def send_task(name, args=(), kwargs=None, queue=None, **options):
        assert options["expires"] > 0  # a message that waited too long is dropped unrun
        out.append((name.rsplit(".", 1)[-1], queue, list(args), kwargs or {}))

    monkeypatch.setattr(hosts.current_app, "send_task", send_task)
    return out


@pytest.fixture
def host_b(db, settings):
    settings.CONTROLPLANE_HOST_TIMEOUT = 30
    return Host.objects.create(name="host-b", capacity=4, seen_at=timezone.now())


@pytest.fixture
def on_b(running):
    """The current run of `orders` is on host B (its driver: a real process there)."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    Run.objects.filter(pk=running.pk).update(
        host="host-b", pid=process.pid, process_started=psutil.Process(process.pid).create_time()
    )
    running.refresh_from_db()
    yield running
    process.kill()
    process.wait()


@pytest.fixture
def running(pipeline):
    return with_current_run(
        Pipeline.objects.get(name="orders"),
        started_at=timezone.now(),
        last_heartbeat_at=timezone.now(),
    )


def test_a_run_on_a_live_host_is_left_to_that_host_and_a_nudge_is_sent_there(
    host_b, on_b, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        assert step(timezone.now()) == "routed to host-b"
    assert sent == [("reconcile_pipeline", "host.host-b", [on_b.pipeline_id], {"placed": False})]
    on_b.refresh_from_db()
    assert on_b.state == "running"  # neither ended nor relaunched from here
    # The coordinator's tick does not visit it (its host's tick does) ...
    assert attention.pipelines_to_visit(timezone.now()) == []
    # ... and asks host B to look at what runs there.
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        summary = reconciler.tick(timezone.now())
    assert summary["hosts"] == ["host-b"]
    assert sent == [("reconcile_host", "host.host-b", [], {})]


def test_a_kill_through_this_host_s_api_is_carried_out_by_the_run_s_host(
    api, host_b, on_b, sent, settings, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/pipelines/orders/kill/", {"reason": "runaway"}, format="json")
    assert response.status_code == 202, response.content
    on_b.refresh_from_db()
    assert (on_b.state, on_b.end_cause) == ("stopping", "killed")  # asked, not yet done
    assert on_b.kill_requested_at is not None
    assert psutil.pid_exists(on_b.pid)
    # Host B's worker takes the step sent to it: it kills the driver, the run ends.
    here = settings.CONTROLPLANE_HOST_NAME
    settings.CONTROLPLANE_HOST_NAME = "host-b"
    Host.objects.update_or_create(name=here, defaults={"seen_at": timezone.now()})
    assert reconciler.reconcile_pipeline(on_b.pipeline_id, timezone.now(), wait=True) == "killed"
    assert wait_for(lambda: psutil.Process(on_b.pid).status() == psutil.STATUS_ZOMBIE)
    on_b.refresh_from_db()
    assert (on_b.state, on_b.cause, on_b.exit_code) == ("exited", "killed", -9)
    assert "killed by oncall: runaway" in on_b.error_tail
    p = orders()
    assert (p.desired_state, p.status) == ("stopped", "stopped")


def test_a_run_on_a_lost_host_ends_its_token_is_refused_and_it_restarts_here(
    host_b,
    on_b,
    sent,
    standin,
    settings,
):
    standin.setenv("STANDIN_MODE", "silent")
    # Silent, but not yet for the timeout: still host B's.
    assert step(at(29)) == "routed to host-b"
    Host.objects.filter(name="host-b").update(seen_at=at(-31))
    assert [name for _, name in attention.pipelines_to_visit(timezone.now())] == ["orders"]
    assert step(timezone.now()) == "host-lost"
    on_b.refresh_from_db()
    assert (on_b.state, on_b.cause) == ("exited", "host-lost")
    assert on_b.error_tail.startswith("host host-b is lost (silent since ")
    assert on_b.error_tail.endswith(": the run's token is revoked")
    # The driver, if it lives on there, is told to stop at its next report.
    response = driver("tok-1").post(f"/api/runs/{on_b.pk}/heartbeat/")
    assert (response.status_code, response.json()["stop"]) == (409, True)
    p = orders()
    assert p.status == "backing-off"  # a failure, judged by the restart policy
    assert p.failures.get().cause == "host-lost"
    # Its next run starts on a live host: this one (host B is lost).
    assert step(p.next_attempt_at) == "start"
    new = Run.objects.get(pipeline=p, generation=2)
    assert new.host == settings.CONTROLPLANE_HOST_NAME


def test_a_lost_host_is_recorded_once_and_heard_again_it_is_not(host_b, sent):
    Host.objects.filter(name="host-b").update(seen_at=at(-31))
    assert hosts.sweep(timezone.now()) == ["host-b"]
    assert hosts.sweep(timezone.now()) == []
    assert Host.objects.get(name="host-b").lost_at is not None
    assert hosts.live(timezone.now()) == [hosts.here()]


def test_a_new_driver_is_placed_on_the_host_with_room_and_launched_there(
    api,
    host_b,
    sent,
    standin,
    settings,
    django_capture_on_commit_callbacks,
):
    standin.setenv("STANDIN_MODE", "silent")
    here = settings.CONTROLPLANE_HOST_NAME
    settings.CONTROLPLANE_HOST_DRIVERS = 1
    Host.objects.create(name=here, capacity=1, seen_at=timezone.now())
    # This host is full (a dedicated driver of another pipeline runs here).
    other = Pipeline.objects.create(name="other", spec=orders().spec)
    Run.objects.create(pipeline=other, generation=1, spec_version=1, state="running", host=here)
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    with django_capture_on_commit_callbacks(execute=True):
        assert step(timezone.now()) == "placed on host-b"
    assert sent == [("reconcile_pipeline", "host.host-b", [orders().pk], {"placed": True})]
    assert not Run.objects.filter(pipeline=orders()).exists()
    # Until its run exists there, it counts as host B's (placements within a tick see it).
    assert orders().placed_host == "host-b"
    assert {h.name: h.used for h in hosts.loads(timezone.now())}["host-b"] == 1
    # On host B, the step sent there launches it there.
    settings.CONTROLPLANE_HOST_NAME = "host-b"
    Host.objects.filter(name=here).update(seen_at=timezone.now())
    assert reconciler.reconcile_pipeline(orders().pk, timezone.now(), placed=True) == "start"
    run = Run.objects.get(pipeline=orders())
    assert run.host == "host-b" and psutil.pid_exists(run.pid)
    assert orders().placed_host == ""

    # Every host full: it waits, and says why.
    Pipeline.objects.filter(pk=orders().pk).update(desired_state="stopped")
    Host.objects.filter(name="host-b").update(capacity=1)
    settings.CONTROLPLANE_HOST_NAME = here
    third = Pipeline.objects.create(name="third", spec=orders().spec, desired_state="running")
    assert reconciler.reconcile_pipeline(third.pk, timezone.now()) is None
    third.refresh_from_db()
    assert third.status_message == (
        "waiting: every control-plane host is full (2 driver processes on 2 hosts)"
    )
    Run.objects.filter(pipeline=other).update(state="exited")  # it had no process
    settings.CONTROLPLANE_HOST_NAME = "host-b"  # so that the fixture can kill its driver


def test_an_application_is_placed_on_a_host_and_lost_with_it(
    host_b,
    sent,
    settings,
    standin,
    django_capture_on_commit_callbacks,
):
    here = settings.CONTROLPLANE_HOST_NAME
    settings.CONTROLPLANE_HOST_DRIVERS = 0  # this host takes no drivers
    app = SparkApplication.objects.create(name="shared", desired_state="running")
    with django_capture_on_commit_callbacks(execute=True):
        reconciler.tick(timezone.now())
    assert ("reconcile_application", "host.host-b", [app.pk], {"placed": True}) in sent
    # Host B launched it (as its worker would have), then went silent.
    SparkApplication.objects.filter(pk=app.pk).update(
        status="running", host="host-b", pid=123456, generation=1
    )
    Host.objects.filter(name="host-b").update(seen_at=at(-31))
    settings.CONTROLPLANE_HOST_DRIVERS = 2
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        summary = reconciler.tick(timezone.now())
    assert summary["lost_hosts"] == ["host-b"]
    app.refresh_from_db()
    assert (app.host, app.generation, app.status) == (here, 2, "starting")
    assert "host host-b is lost" in app.last_error
    assert launcher.application_alive(app) is True  # started again here (a stand-in)
    launcher.kill_application(app)
    assert wait_for(lambda: launcher.application_alive(app) is False)


def test_hosts_are_listed_by_the_api_and_scraped_by_prometheus(api, host_b, anon):
    lost = Host.objects.create(name="host-c", capacity=2, seen_at=at(-120))
    response = api.get("/api/hosts/")
    assert response.status_code == 200
    rows = {row["name"]: row for row in response.json()}
    assert set(rows) == {"host-b", "host-c"}  # hosts whose worker was heard
    assert (rows["host-b"]["state"], rows["host-b"]["capacity"]) == ("up", 4)
    assert rows["host-b"]["drivers"] == 0
    assert rows["host-c"]["state"] == "lost"
    assert rows["host-c"]["heartbeat_age_seconds"] >= 120
    assert anon.get("/api/hosts/").status_code == 401

    text = api.get("/metrics").content.decode()
    assert 'cp_host_up{host="host-b"} 1.0' in text
    assert 'cp_host_up{host="host-c"} 0.0' in text
    assert 'cp_host_capacity{host="host-c"} 2.0' in text
    assert 'cp_host_drivers{host="host-b"} 0.0' in text
    assert lost.name in text
