"""A driver's exit report carries its verdict on the failure (`failure`: permanent or
transient, decided by the exception's type in the driver: jobs.failures). A permanent one
fails the pipeline at once with the reason in words, whatever the restart policy (the default
one restarts forever); a transient one is left to the policy. Reports without a verdict (an
older driver's) are judged by the old reading of the error output.

No Spark: the run is made in the database, its exit reported through the API (or left in its
exit.json for the tick), as the supervisor does; one test runs the real supervisor around a
stand-in driver (tests/drivers/standin.py) that writes a verdict as jobs/run.py would.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.definitions.models import Pipeline, Run
from controlplane.supervision import reconciler
from jobs import failures
from tests.factories import valid_spec
from tests.runs import orders, start, step, with_current_run
from tests.waiting import wait_until

REASON = (
    'a definition error (the sink table has no such column): column "ts" of relation '
    '"orders" does not exist'
)
PERMANENT = {
    "kind": "permanent",
    "reason": REASON,
    "type": "psycopg.errors.UndefinedColumn",
    "condition": "42703",
}
TRANSIENT = {
    "kind": "transient",
    "reason": "OperationalError: connection to server at 127.0.0.1 failed",
    "type": "psycopg.OperationalError",
    "condition": "",
}
# What the error output says: the old text table finds nothing permanent in the first, and a
# definition error in the second.
PLAIN_TAIL = 'Traceback (most recent call last):\npsycopg.errors.UndefinedColumn: column "ts"'
ANALYSIS_TAIL = (
    "pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION]"
    " A column, variable, or function parameter with name `amout` cannot be resolved."
)


@pytest.fixture
def running(api, kafka_connection, postgres_connection):
    """`orders` under the default restart policy (exponential-delay: restarts forever), with a
    current run (generation 1) whose driver holds token 'tok-1'."""
    spec = valid_spec()
    del spec["restart_policy"]
    created = api.post("/api/pipelines/", {"name": "orders", "spec": spec}, format="json")
    assert created.status_code == 201, created.json()
    row = Pipeline.objects.get(name="orders")
    assert row.spec["restart_policy"]["kind"] == "exponential-delay"
    return with_current_run(row, started_at=timezone.now())


def exit_report(run: Run, **body):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="RunToken tok-1")
    return client.post(f"/api/runs/{run.pk}/exit/", {"exit_code": 1, **body}, format="json")


def test_a_permanent_failure_fails_the_pipeline_at_once_with_its_reason(api, running):
    response = exit_report(running, error_tail=PLAIN_TAIL, failure=PERMANENT)
    assert response.status_code == 200, response.json()
    assert response.json() == {"recorded": True}
    pipeline = orders()
    assert (pipeline.status, pipeline.next_attempt_at) == ("failed", None)
    failure = pipeline.failures.get()
    assert failure.permanent
    assert failure.decision == f"gave up: {REASON} (permanent: restarting cannot fix it)"
    assert failure.restart_at is None
    assert failure.message == PLAIN_TAIL
    # The tick, an hour later, starts nothing: a failed pipeline waits for an operator.
    assert reconciler.reconcile_pipeline(pipeline.pk, timezone.now() + timedelta(hours=1)) is None
    assert orders().status == "failed"
    assert list(Run.objects.filter(pipeline=pipeline).values_list("state", "cause")) == [
        ("exited", "crashed")
    ]
    shown = api.get("/api/pipelines/orders/").json()["last_failure"]
    assert shown["decision"] == failure.decision


def test_a_transient_failure_is_left_to_the_restart_policy(running):
    """The verdict decides, not the text: this output would read as a definition error."""
    response = exit_report(running, error_tail=ANALYSIS_TAIL, failure=TRANSIENT)
    assert response.status_code == 200
    pipeline = orders()
    assert pipeline.status == "backing-off"
    assert pipeline.next_attempt_at is not None
    failure = pipeline.failures.get()
    assert not failure.permanent
    assert not failure.decision.startswith("gave up")  # the policy's words: a restart
    assert failure.restart_at == pipeline.next_attempt_at
    early = pipeline.next_attempt_at - timedelta(milliseconds=1)
    assert reconciler.reconcile_pipeline(pipeline.pk, early) is None  # not due yet
    assert orders().status == "backing-off"


def test_a_report_without_a_verdict_is_judged_by_its_error_output(running):
    """An older driver's report: the text table is the fallback."""
    response = exit_report(running, error_tail=ANALYSIS_TAIL)
    assert response.status_code == 200
    pipeline = orders()
    assert pipeline.status == "failed"
    failure = pipeline.failures.get()
    assert failure.permanent
    assert failure.decision.startswith("gave up: a definition error")


@pytest.mark.parametrize(
    ("failure", "problem"),
    [
        ({"kind": "fatal", "reason": "x"}, "kind must be one of permanent, transient"),
        ({"kind": "permanent"}, "reason must be a non-empty string"),
        ({"kind": "permanent", "reason": "  "}, "reason must be a non-empty string"),
        (
            {"kind": "permanent", "reason": "x" * (failures.MAX_REASON + 1)},
            f"reason must be at most {failures.MAX_REASON} characters",
        ),
        (
            {"kind": "permanent", "reason": "x", "type": "T" * (failures.MAX_TYPE + 1)},
            f"type must be at most {failures.MAX_TYPE} characters",
        ),
        ({"kind": "permanent", "reason": "x", "condition": ["42703"]}, "condition must be a"),
        ("permanent", "must be an object"),
    ],
)
def test_a_verdict_that_is_not_one_is_refused(running, failure, problem):
    response = exit_report(running, error_tail="", failure=failure)
    assert response.status_code == 400
    assert list(response.json()) == ["failure"]
    assert response.json()["failure"][0].startswith(problem)
    running.refresh_from_db()
    assert running.state == "running"  # nothing recorded
    assert not orders().failures.exists()


def test_the_tick_reads_the_verdict_from_exit_json(running, tmp_path):
    """The report did not get through (the control plane was down): the tick finds the
    supervisor's exit.json, verdict included."""
    (tmp_path / "exit.json").write_text(
        json.dumps({"exit_code": 1, "error_tail": PLAIN_TAIL, "failure": PERMANENT})
    )
    Run.objects.filter(pk=running.pk).update(run_dir=str(tmp_path))
    pipeline = orders()
    assert reconciler.reconcile_pipeline(pipeline.pk, timezone.now()) == "crashed"
    pipeline = orders()
    assert (pipeline.status, pipeline.next_attempt_at) == ("failed", None)
    assert pipeline.failures.get().decision.startswith(f"gave up: {REASON}")


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_sends_the_drivers_verdict_with_its_exit(
    api, standin, settings, live_server
):
    """The real supervisor (jobs.supervise) around a stand-in driver that writes its verdict
    as jobs/run.py does: the exit report carries it, and the pipeline fails at once although
    its policy would restart it and its output reads as a transient failure."""
    settings.CONTROLPLANE_URL = live_server.url
    standin.setenv("STANDIN_FAILURE", json.dumps(PERMANENT))  # STANDIN_ERROR: out of memory
    t = start(api, {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 30})
    assert step(t) == "start"
    run = Run.objects.get(pipeline=orders())
    # No tick from here on: only the supervisor's own report can end the run.
    wait_until(lambda: Run.objects.get(pk=run.pk).state == "exited", 10, "the exit report")
    run.refresh_from_db()
    assert (run.state, run.cause, run.exit_code) == ("exited", "crashed", 1)
    assert "OutOfMemoryError" in run.error_tail
    assert json.loads((Path(run.run_dir) / "exit.json").read_text())["failure"] == PERMANENT
    pipeline = orders()
    assert (pipeline.status, pipeline.next_attempt_at) == ("failed", None)
    assert pipeline.failures.get().decision.startswith(f"gave up: {REASON}")


def test_a_stored_definition_this_version_refuses_fails_permanently_not_the_tick(running):
    """A spec saved under looser rules (here an exponential-delay multiplier of 1, refused
    since restart policies follow Flink's) is refused by its driver at every start: the
    failure is recorded, permanent, naming the field, instead of the tick raising on it."""
    spec = dict(running.pipeline.spec)
    spec["restart_policy"] = {**spec["restart_policy"], "multiplier": 1}
    Pipeline.objects.filter(pk=running.pipeline_id).update(spec=spec)
    response = exit_report(running, error_tail=PLAIN_TAIL, failure=TRANSIENT)
    assert response.status_code == 200, response.json()
    pipeline = orders()
    assert (pipeline.status, pipeline.next_attempt_at) == ("failed", None)
    failure = pipeline.failures.get()
    assert failure.permanent
    assert failure.decision.startswith("gave up: the stored definition no longer validates")
    assert "restart_policy.multiplier" in failure.decision
