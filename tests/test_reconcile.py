"""The reconcile tick, directly and through a real Celery worker and beat on Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from controlplane.definitions.models import Pipeline, ReconcilerState, Run
from controlplane.supervision import launcher, reconciler
from tests.factories import valid_spec
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_a_tick_records_itself_and_is_idempotent(pipeline):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = reconciler.tick(now)
    second = reconciler.tick(now)
    assert first == second == {"pipelines": 1, "visited": 0, "actions": {}}
    state = ReconcilerState.objects.get()
    assert (state.ticks, state.last_tick_at) == (2, now)
    assert Pipeline.objects.get(name="orders").status == "stopped"


def test_a_pipeline_that_looks_alive_without_a_run_is_settled(pipeline):
    Pipeline.objects.filter(name="orders").update(status="running")
    assert reconciler.tick(datetime(2026, 1, 1, tzinfo=UTC))["actions"] == {"orders": "settle"}
    assert Pipeline.objects.get(name="orders").status == "stopped"


def worker_env(tmp_path) -> dict:
    env = dict(os.environ)
    db = connection.settings_dict  # the test database, which the worker must use too
    credentials = quote(db["USER"], safe="") + (
        ":" + quote(db["PASSWORD"], safe="") if db["PASSWORD"] else ""
    )
    env["DATABASE_URL"] = f"postgresql://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env["CONTROLPLANE_RECONCILE_SECONDS"] = "1"
    env["CONTROLPLANE_VAR_DIR"] = str(tmp_path)
    return env


def start_worker(env, tmp_path, name="celery") -> subprocess.Popen:
    """A Celery worker with embedded beat, in a session of its own (killable as a whole)."""
    command = [
        sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--beat",
        "--concurrency", "1", "--loglevel", "INFO",
        "--without-heartbeat", "--without-gossip", "--without-mingle",
        "--schedule", str(tmp_path / f"{name}-beat-schedule"),
    ]  # fmt: skip
    log = open(tmp_path / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def ticks() -> int:
    state = ReconcilerState.objects.filter(id=1).first()
    return state.ticks if state else 0


@pytest.mark.django_db(transaction=True)
def test_celery_beat_and_a_worker_run_the_tick_and_the_metrics_collector_through_redis(
    tmp_path,
):
    from controlplane.definitions.models import LagSample

    pipeline = Pipeline.objects.create(name="sampled", spec=valid_spec())
    env = {**worker_env(tmp_path), "CONTROLPLANE_COLLECT_SECONDS": "1"}
    worker = start_worker(env, tmp_path)
    try:
        assert wait_for(lambda: ticks() >= 2 or worker.poll() is not None, timeout=60)
        assert ticks() >= 2, (tmp_path / "celery.log").read_text()
        # The collector's rounds: a lag sample each (its connection does not exist here, so
        # the lag is unknown, and says why).
        samples = LagSample.objects.filter(pipeline=pipeline)
        assert wait_for(lambda: samples.count() >= 2, timeout=30), (
            tmp_path / "celery.log"
        ).read_text()
        assert pipeline.figures.lag_error == "its Kafka connection does not exist"
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.django_db(transaction=True)
def test_killing_the_worker_and_beat_neither_kills_nor_duplicates_the_driver(
    api, pipeline, tmp_path
):
    """The whole Celery side dies (SIGKILL) while a pipeline runs; a new worker adopts the
    running driver instead of launching a second one."""
    env = worker_env(tmp_path)
    env.update(
        SPARK_SUBMIT=str(ROOT / "tests" / "drivers" / "standin.py"),
        STANDIN_MODE="silent",
        CONTROLPLANE_DRIVER_ENV="STANDIN_*",
        CONTROLPLANE_RUNS_ROOT=str(tmp_path / "runs"),
        CONTROLPLANE_CHECKPOINT_ROOT=str(tmp_path / "checkpoints"),
    )
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    first = start_worker(env, tmp_path, "first")
    try:
        assert wait_for(lambda: Run.objects.filter(state="running").exists(), timeout=60), (
            tmp_path / "first.log"
        ).read_text()
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    run = Run.objects.get()
    assert launcher.alive(run)  # the driver outlived the worker that launched it

    second = start_worker(env, tmp_path, "second")
    try:
        before = ticks()
        assert wait_for(lambda: ticks() >= before + 3, timeout=60)
        assert list(Run.objects.values_list("pk", "state", "pid")) == [(run.pk, "running", run.pid)]
        assert launcher.alive(run)
        assert api.post("/api/pipelines/orders/stop/").status_code == 202
        assert wait_for(lambda: Run.objects.get().state == "exited", timeout=60)
        assert Run.objects.get().cause == "stopped"
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(timeout=30)
        launcher.kill(run)


def test_a_failed_pipeline_is_not_relaunched_until_started_again(api, pipeline):
    Pipeline.objects.filter(name="orders").update(desired_state="running", status="failed")
    assert reconciler.tick(datetime(2026, 1, 1, tzinfo=UTC))["actions"] == {}
    response = api.post("/api/pipelines/orders/start/")
    assert response.status_code == 202
    assert response.json()["status"] == "stopped"  # the next tick launches it


def test_the_periodic_tasks_ack_on_receipt_and_the_others_after_running():
    """A message still unacknowledged when Redis goes away crashes kombu 5.7's worker as it
    restores it: the periodic tasks (idempotent, redone by the next one) ack on receipt."""
    from controlplane.celery import app

    app.loader.import_default_modules()
    for name in (
        "controlplane.supervision.tasks.reconcile",
        "controlplane.observability.tasks.collect_metrics",
        "controlplane.observability.tasks.compact_progress",
    ):
        assert app.tasks[name].acks_late is False, name
    assert app.tasks["controlplane.supervision.tasks.reconcile_pipeline"].acks_late is True
