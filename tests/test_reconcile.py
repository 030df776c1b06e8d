"""The reconcile tick, directly and through a real Celery worker and beat on Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from controlplane.pipelines import reconciler
from controlplane.pipelines.models import Pipeline, ReconcilerState

ROOT = Path(__file__).resolve().parent.parent


def test_a_tick_records_itself_and_is_idempotent(pipeline):
    now = datetime(2026, 1, 1, tzinfo=UTC)
    first = reconciler.tick(now)
    second = reconciler.tick(now)
    assert first == second == {"pipelines": 1, "actions": {}}
    state = ReconcilerState.objects.get()
    assert (state.ticks, state.last_tick_at) == (2, now)
    assert Pipeline.objects.get(name="orders").status == "stopped"


def test_a_pipeline_that_looks_alive_without_a_run_is_settled(pipeline):
    Pipeline.objects.filter(name="orders").update(status="running")
    assert reconciler.tick(datetime(2026, 1, 1, tzinfo=UTC))["actions"] == {"orders": "settle"}
    assert Pipeline.objects.get(name="orders").status == "stopped"


@pytest.mark.django_db(transaction=True)
def test_celery_beat_and_a_worker_run_the_tick_through_redis(tmp_path):
    env = dict(os.environ)
    db = connection.settings_dict  # the test database, which the worker must use too
    credentials = quote(db["USER"], safe="") + (
        ":" + quote(db["PASSWORD"], safe="") if db["PASSWORD"] else ""
    )
    env["DATABASE_URL"] = f"postgresql://{credentials}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    env["CONTROLPLANE_RECONCILE_SECONDS"] = "1"
    env["CONTROLPLANE_VAR_DIR"] = str(tmp_path)
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "controlplane",
        "worker",
        "--beat",
        "--concurrency",
        "1",
        "--loglevel",
        "INFO",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        "--schedule",
        str(tmp_path / "beat-schedule"),
    ]
    log = open(tmp_path / "celery.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        ticks = 0
        while time.monotonic() < deadline:
            state = ReconcilerState.objects.filter(id=1).first()
            ticks = state.ticks if state else 0
            if ticks >= 2:
                break
            assert worker.poll() is None, (tmp_path / "celery.log").read_text()
            time.sleep(0.5)
        assert ticks >= 2, (tmp_path / "celery.log").read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()


def test_a_failed_pipeline_is_not_relaunched_until_started_again(api, pipeline):
    Pipeline.objects.filter(name="orders").update(desired_state="running", status="failed")
    assert reconciler.tick(datetime(2026, 1, 1, tzinfo=UTC))["actions"] == {}
    response = api.post("/api/pipelines/orders/start/")
    assert response.status_code == 202
    assert response.json()["status"] == "stopped"  # the next tick launches it
