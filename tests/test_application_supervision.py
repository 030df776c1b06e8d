"""Supervision of shared Spark applications and their members, fast: the application's
driver is a stand-in for jobs/host.py (tests/drivers/standin.py) under the real supervisor,
which claims assignments and ends members as the real one does, without Spark. Real Spark
applications are in test_shared_applications.py.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from controlplane.definitions.models import Failure, Pipeline, Run, RunState, SparkApplication
from controlplane.supervision import applications, controls, launcher, reconciler
from tests.factories import valid_spec
from tests.runs import current
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def apps(standin):
    made = []

    def make(name: str, capacity: int = 5, **fields) -> SparkApplication:
        app = SparkApplication.objects.create(name=name, capacity=capacity, **fields)
        made.append(app)
        return app

    yield make
    for app in SparkApplication.objects.all():
        if app.pid:
            launcher.kill_application(app)


def new_pipeline(api, name: str, placement: str) -> Pipeline:
    spec = valid_spec(sink={**valid_spec()["sink"], "table": name.replace("-", "_")})
    response = api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    Pipeline.objects.filter(name=name).update(placement=placement)
    assert api.post(f"/api/pipelines/{name}/start/").status_code == 202
    return Pipeline.objects.get(name=name)


def until(predicate, what: str, timeout: float = 20, at=None):
    """Tick (at the time `at()`, or now) until `predicate()` holds; the stand-ins make a
    tick cheap: polled at the default interval."""

    def ticked():
        reconciler.tick(at() if at else timezone.now())
        return predicate()

    def details() -> str:
        return (
            f"{list(SparkApplication.objects.values())}"
            f" {list(Run.objects.values('pipeline__name', 'state', 'cause', 'application_id'))}"
            f" {list(Pipeline.objects.values('name', 'status', 'status_message'))}"
        )

    wait_until(ticked, timeout, what, details=details)


def app(name: str) -> SparkApplication:
    return SparkApplication.objects.get(name=name)


def members(name: str) -> set[str]:
    return set(applications.members(app(name)).values_list("pipeline__name", flat=True))


def running(name: str) -> bool:
    return app(name).status == "running"


def test_auto_placement_takes_the_application_with_most_room_and_waits_when_all_are_full(
    api, apps, pipeline
):
    apps("small", capacity=1)
    apps("big", capacity=2)
    until(lambda: running("small") and running("big"), "both applications up")
    for name in ("p1", "p2", "p3", "p4"):
        new_pipeline(api, name, "auto")
    until(lambda: len(members("big")) + len(members("small")) == 3, "three placed")
    assert (members("big"), members("small")) == ({"p1", "p2"}, {"p3"})
    p4 = Pipeline.objects.get(name="p4")
    assert current("p4") is None
    assert p4.status_message == "waiting: every shared application is full"
    # A member's run names its application's process.
    assert current("p1").pid == app("big").pid and current("p1").application_generation == 1
    # A place frees up: the waiting pipeline takes it.
    api.post("/api/pipelines/p1/stop/", {"reason": "make room"}, format="json")
    until(lambda: "p4" in members("big"), "p4 placed in the freed place")
    assert Pipeline.objects.get(name="p4").status_message == ""
    assert current("p1").cause == "stopped"


def test_a_pipeline_waits_for_a_named_application_that_is_missing_stopped_or_full(
    api, apps, pipeline
):
    new_pipeline(api, "lonely", "nowhere")
    until(
        lambda: "does not exist" in Pipeline.objects.get(name="lonely").status_message,
        "the missing application named",
    )
    apps("nowhere", capacity=1, desired_state="stopped")
    until(
        lambda: (
            Pipeline.objects.get(name="lonely").status_message
            == "waiting: shared application 'nowhere' is stopped (wanted stopped)"
        ),
        "the stopped application named",
    )
    SparkApplication.objects.filter(name="nowhere").update(desired_state="running")
    until(lambda: members("nowhere") == {"lonely"}, "placed once it runs")
    new_pipeline(api, "second", "nowhere")
    until(
        lambda: (
            Pipeline.objects.get(name="second").status_message
            == "waiting: shared application 'nowhere' is full"
        ),
        "the full application named",
    )
    # A dedicated pipeline never waits for an application.
    assert Pipeline.objects.get(name="orders").placement == "dedicated"


def test_a_killed_member_ends_when_its_application_says_so_and_the_others_run_on(
    api, apps, pipeline, user
):
    apps("shared")
    for name in ("a", "b"):
        new_pipeline(api, name, "shared")
    until(lambda: members("shared") == {"a", "b"}, "both placed")
    queue = Path(app("shared").app_dir, "queue")
    until(lambda: len(list(queue.glob("*.taken"))) == 2, "both claimed by the application")
    a = current("a")
    controls.act(
        Pipeline.objects.get(name="a"), "kill", user=user, reason="test", now=timezone.now()
    )
    a.refresh_from_db()
    # Its query is stopped by its application, which writes exit.json: the run ends then
    # (at once only if the application was quicker than the kill's own last look).
    assert (a.kill_requested_at is not None and a.end_cause == "killed") or a.cause == "killed"
    until(lambda: current("a").state == "exited", "the killed member ended")
    assert (current("a").cause, current("a").error_tail) == ("killed", f"killed by {user}: test")
    assert members("shared") == {"b"} and current("b").generation == 1
    assert app("shared").generation == 1  # the application was not touched


def test_a_member_that_will_not_stop_gets_its_application_recycled(
    api,
    apps,
    pipeline,
    standin,
    settings,
    user,
):
    settings.CONTROLPLANE_KILL_TIMEOUT = 1
    standin.setenv("STANDIN_STUCK", "stuck")
    apps("shared")
    for name in ("stuck", "other"):
        new_pipeline(api, name, "shared")
    until(lambda: members("shared") == {"stuck", "other"}, "both placed")
    queue = Path(app("shared").app_dir, "queue")
    until(lambda: len(list(queue.glob("*.taken"))) == 2, "both claimed by the application")
    first_pid = app("shared").pid
    controls.act(
        Pipeline.objects.get(name="stuck"), "kill", user=user, reason="test", now=timezone.now()
    )
    until(lambda: app("shared").generation == 2, "the application recycled")
    recycled = app("shared")
    assert "did not stop within 1 s of being killed (killed)" in recycled.recycle_reason
    assert recycled.restarts == 0 and recycled.pid != first_pid
    # The stuck one ended with the cause it was killed for; the other was stopped gracefully,
    # which is no failure, and comes back in the new process.
    assert Run.objects.get(pipeline__name="stuck", generation=1).cause == "killed"
    assert Run.objects.get(pipeline__name="other", generation=1).cause == "recycled"
    until(lambda: members("shared") == {"other"}, "the other member back")
    assert current("other").application_generation == 2
    assert not Failure.objects.exists()


def test_a_lost_application_fails_every_member_and_is_started_again_with_growing_delays(
    api, apps, pipeline
):
    apps("shared")
    for name in ("a", "b"):
        new_pipeline(api, name, "shared")
    until(lambda: members("shared") == {"a", "b"}, "both placed")
    os.killpg(app("shared").pid, signal.SIGKILL)  # supervisor and driver: nothing reports
    until(lambda: Failure.objects.count() == 2, "both members failed")
    assert set(Failure.objects.values_list("cause", flat=True)) == {"application-lost"}
    until(lambda: app("shared").generation == 2 and running("shared"), "started again at once")
    assert (app("shared").restarts, app("shared").attempt) == (1, 1)
    # Lost again soon after: the next start waits (2 s for the second loss in a row).
    os.killpg(app("shared").pid, signal.SIGKILL)
    until(lambda: app("shared").status == "restarting", "the second loss seen")
    lost = app("shared")
    assert lost.attempt == 2 and lost.next_attempt_at is not None
    assert lost.next_attempt_at - lost.last_exit_at == timedelta(seconds=2)
    assert lost.pid is None
    until(lambda: app("shared").generation == 3, "started again after its delay", timeout=10)
    # The members come back per their own policy (fixed delay of 10 s here).
    later = timezone.now() + timedelta(seconds=11)
    until(lambda: members("shared") == {"a", "b"}, "members back", at=lambda: later)


def test_stop_drivers_stops_shared_applications_with_their_members_without_a_loss(
    api, apps, pipeline
):
    apps("shared")
    new_pipeline(api, "a", "shared")
    until(lambda: members("shared") == {"a"}, "placed")
    pid = app("shared").pid
    call_command("stop_drivers", timeout=10)
    assert launcher.application_alive(SparkApplication(pid=pid, host=app("shared").host)) is False
    stopped = app("shared")
    assert (stopped.status, stopped.pid, stopped.restarts) == ("stopped", None, 0)
    assert current("a").state == RunState.EXITED and current("a").cause == "stopped"
    # Still wanted running: started again with the stack.
    until(lambda: running("shared") and members("shared") == {"a"}, "back with the stack")
