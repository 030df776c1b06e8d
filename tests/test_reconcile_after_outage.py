"""After the control plane itself was down (its database, broker or workers), a driver's
silence during the outage is not held against it: heartbeats and progress sent meanwhile got
503s. Its silence counts from when the ticks resumed."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import psutil
import pytest

from controlplane.pipelines import reconciler
from controlplane.pipelines.models import Pipeline, ReconcilerState, Run

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def driver():
    process = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def heard_until_t0(pipeline, driver, settings):
    settings.CONTROLPLANE_HEARTBEAT_TIMEOUT = 30
    settings.CONTROLPLANE_RECONCILE_SECONDS = 5
    row = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=row.pk).update(
        generation=1, desired_state="running", status="running"
    )
    run = Run.objects.create(
        pipeline=row,
        generation=1,
        spec_version=1,
        state="running",
        pid=driver.pid,
        host=socket.gethostname(),
        process_started=psutil.Process(driver.pid).create_time(),
        started_at=T0 - timedelta(minutes=5),
        last_heartbeat_at=T0,
        last_batch_at=T0,
    )
    ReconcilerState.objects.create(id=1, last_tick_at=T0)
    return run


def test_silence_during_an_outage_of_the_control_plane_is_not_a_lost_driver(heard_until_t0):
    # 40 s without a tick (the database was down) and without a heartbeat (they got 503s).
    after = T0 + timedelta(seconds=40)
    assert reconciler.tick(after)["actions"] == {}
    assert Run.objects.get(pk=heard_until_t0.pk).state == "running"
    assert ReconcilerState.objects.get().resumed_at == after
    # Still silent a whole timeout after the control plane came back: now it is lost.
    for second in range(5, 31, 5):
        assert reconciler.tick(after + timedelta(seconds=second))["actions"] == {}
    actions = reconciler.tick(after + timedelta(seconds=35))["actions"]
    assert actions == {"orders": "lost-heartbeat"}


def test_without_an_outage_the_same_silence_is_a_lost_driver(heard_until_t0):
    for second in range(5, 31, 5):  # ticks all along: the control plane was listening
        reconciler.tick(T0 + timedelta(seconds=second))
    actions = reconciler.tick(T0 + timedelta(seconds=35))["actions"]
    assert actions == {"orders": "lost-heartbeat"}
