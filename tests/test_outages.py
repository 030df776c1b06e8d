"""Outages of the control plane's own services, tried on a whole control plane of its own
(tests/outage_stack.py: its own PostgreSQL and Redis, gunicorn, a Celery worker with beat,
and a real Spark driver under load).

- Redis stopped while an operator restarts a pipeline: the request answers at once (the
  change is in Postgres), /healthz names the broker, and the restart happens once Redis is
  back.
- PostgreSQL (the control plane's database and the sink's, one server) stopped for 30 s
  under load: /healthz says 503 meanwhile, no failure is recorded, the same run carries on by
  itself, and every record is in the sink exactly once.
- The web app, the worker and beat are SIGKILLed under a shared Spark application: its
  member keeps writing meanwhile, and once they are back the application and its member's
  run are adopted as they are (same process, same run, heard again), exactly once.
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest
import requests

from tests.kafka_helpers import Load, new_topic
from tests.outage_stack import OutageStack, sink_counts
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

PIPELINE = "outage"


@pytest.fixture(scope="module")
def stack(kafka_bootstrap):
    stack = OutageStack(kafka_bootstrap).start()
    try:
        yield stack
    finally:
        stack.close()


def wait(predicate, timeout: float, what: str, stack: OutageStack) -> None:
    """Poll `predicate()` (an HTTP call to the stack, or its database: every 0.5 s) until it
    holds; errors while a service is down count as "not yet". On a timeout: the runs, and
    the worker's and the last driver's logs."""

    def details() -> str:
        runs = ""
        with contextlib.suppress(requests.RequestException):
            runs = stack.api("GET", f"/api/pipelines/{PIPELINE}/runs/").text[-3000:]
        logs = sorted((stack.var / "runs").glob("*/*/driver.log"))
        driver = logs[-1].read_text(errors="replace")[-5000:] if logs else ""
        return f"runs: {runs}\nworker: {stack.log('worker')[-2000:]}\ndriver: {driver}"

    wait_until(
        predicate,
        timeout,
        what,
        every=0.5,
        details=details,
        ignore=(requests.RequestException, ValueError, KeyError),
    )


def runs(stack: OutageStack) -> list[dict]:
    return stack.api("GET", f"/api/pipelines/{PIPELINE}/runs/").json()["results"]


def healthz(stack: OutageStack) -> tuple[int, dict]:
    response = requests.get(f"{stack.url}/healthz", timeout=5)
    return response.status_code, response.json()


@pytest.fixture(scope="module")
def pipeline(stack, kafka_bootstrap):
    """A real driver reading a topic under load into a table of the stack's sink database."""
    for body in (
        {"name": "events", "kind": "kafka", "settings": {"bootstrap_servers": [kafka_bootstrap]}},
        {"name": "warehouse", "kind": "postgres", "settings": {"dsn": stack.sink_dsn}},
    ):
        response = stack.api("POST", "/api/connections/", json=body)
        assert response.status_code == 201, response.text
    topic = new_topic(kafka_bootstrap)
    table = f"outage_{topic.replace('-', '_')}"
    spec = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": table},
        "trigger": {"interval_seconds": 1},
        "restart_policy": {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 1},
    }
    response = stack.api("POST", "/api/pipelines/", json={"name": PIPELINE, "spec": spec})
    assert response.status_code == 201, response.text
    load = Load(kafka_bootstrap, topic)
    assert stack.api("POST", f"/api/pipelines/{PIPELINE}/start/").status_code == 202
    try:
        wait(lambda: sink_counts(stack, table)[0] > 0, 180, "the first rows", stack)
        yield {"table": table, "load": load}
    finally:
        load.stop()


def test_a_restart_asked_for_while_redis_is_down_answers_at_once_and_happens_after(stack, pipeline):
    before = runs(stack)[0]
    assert before["state"] == "running"
    stack.redis.stop()
    try:
        # The client gives up after 5 s: a request that waited on the broker would fail here.
        response = stack.api(
            "POST", f"/api/pipelines/{PIPELINE}/restart/", json={"reason": "drill"}, timeout=5
        )
        assert response.status_code == 202, response.text
        code, body = healthz(stack)
        assert code == 503 and body["broker"] != "ok" and body["database"] == "ok", body
        time.sleep(6)  # Redis stays down (6 ticks' time): nothing can act on the restart yet
        assert runs(stack)[0]["generation"] == before["generation"]
    finally:
        stack.redis.start()
    wait(
        lambda: (
            runs(stack)[0]["generation"] > before["generation"]
            and runs(stack)[0]["state"] == "running"
        ),
        180,
        "the restart once Redis is back",
        stack,
    )
    assert healthz(stack)[0] == 200
    audit = stack.api("GET", f"/api/audit/?pipeline={PIPELINE}").json()["results"]
    assert ("restart", "drill") in [(e["action"], e["reason"]) for e in audit]


def test_postgres_stopped_for_30_s_under_load_costs_a_pause_not_a_failure(stack, pipeline):
    table, load = pipeline["table"], pipeline["load"]
    wait(lambda: runs(stack)[0]["state"] == "running", 120, "a running driver", stack)
    before = runs(stack)[0]
    wait(lambda: sink_counts(stack, table)[0] > 0, 60, "rows before the outage", stack)

    stack.postgres.stop()
    down_since = time.monotonic()
    answers = []
    try:
        while time.monotonic() - down_since < 30:
            answers.append(healthz(stack))
            time.sleep(3)
    finally:
        stack.postgres.start()
    assert answers and all(code == 503 and body["database"] != "ok" for code, body in answers)

    time.sleep(4)  # the load goes on after the outage too
    produced = load.stop()
    wait(lambda: sink_counts(stack, table)[0] >= produced, 240, f"{produced} rows", stack)
    assert sink_counts(stack, table) == (produced, produced)  # exactly once
    after = runs(stack)[0]
    assert (after["generation"], after["state"]) == (before["generation"], "running")
    failures = stack.api("GET", f"/api/pipelines/{PIPELINE}/failures/").json()["results"]
    assert failures == [], failures


SHARED = """
import json
from controlplane.definitions.models import Run, SparkApplication
app = SparkApplication.objects.get(name="fleet")
run = Run.objects.filter(pipeline__name="adopted").order_by("-generation").first()
print(json.dumps({
    "app": [app.status, app.generation, app.pid, app.restarts],
    "run": run and [run.pk, run.generation, run.state, run.pid, run.application_generation],
    "heard": run and run.last_heartbeat_at and run.last_heartbeat_at.timestamp(),
}))
"""


def shared_state(stack: OutageStack) -> dict:
    return json.loads(stack.shell(SHARED).strip().splitlines()[-1])


def test_a_shared_application_is_adopted_after_web_worker_and_beat_are_killed(
    stack, pipeline, kafka_bootstrap
):
    body = {"name": "fleet", "capacity": 5, "driver_memory": "1g"}
    response = stack.api("POST", "/api/applications/", json=body)
    assert response.status_code == 201, response.text
    topic = new_topic(kafka_bootstrap)
    table = f"adopted_{topic.replace('-', '_')}"
    spec = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": table},
        "trigger": {"interval_seconds": 1},
    }
    body = {"name": "adopted", "spec": spec, "placement": "fleet"}
    response = stack.api("POST", "/api/pipelines/", json=body)
    assert response.status_code == 201, response.text
    load = Load(kafka_bootstrap, topic)
    try:
        assert stack.api("POST", "/api/pipelines/adopted/start/").status_code == 202
        wait(lambda: sink_counts(stack, table)[0] > 0, 240, "the member's first rows", stack)
        before = shared_state(stack)
        assert before["app"][0] == "running" and before["run"][2] == "running"
        assert before["run"][3] == before["app"][2]  # the run is the application's member

        stack.kill("web")
        stack.kill("worker")  # with beat: no tick, no report is heard
        written = sink_counts(stack, table)[0]
        # It writes on without a control plane: batches committed, not only the one in flight
        # (the load sends ~200 records a second).
        wait(
            lambda: sink_counts(stack, table)[0] > written + 1000,
            60,
            "rows written without a control plane",
            stack,
        )
        back = time.time()
        stack.start_web()
        stack.start_worker()
        stack.wait_for_web()
        wait(lambda: (shared_state(stack)["heard"] or 0) > back, 60, "the member heard", stack)
        time.sleep(3)  # a few ticks (one a second)
        after = shared_state(stack)
        # Adopted as they were: the same process (no restart) and the same run.
        assert after["app"] == before["app"]
        assert after["run"] == before["run"]
    finally:
        produced = load.stop()
    wait(lambda: sink_counts(stack, table)[0] >= produced, 120, f"{produced} rows", stack)
    assert sink_counts(stack, table) == (produced, produced)  # exactly once
    stack.api("POST", "/api/pipelines/adopted/stop/")
