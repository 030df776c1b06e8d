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

from controlplane.definitions.models import Pipeline, ReconcilerState, Run
from controlplane.supervision import reconciler

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
def heard_until_t0(pipeline, driver, settings, listening):
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
    run.listening_url = listening.url
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


def test_a_silent_driver_is_not_killed_while_the_web_app_it_reports_to_is_down(
    heard_until_t0, settings, black_hole_url
):
    """The reports go through the web app: when it does not answer, every driver is silent,
    and killing them all would turn an outage of the control plane into one of the data."""
    settings.CONTROLPLANE_URL = black_hole_url
    for second in range(5, 31, 5):
        reconciler.tick(T0 + timedelta(seconds=second))
    assert reconciler.tick(T0 + timedelta(seconds=35))["actions"] == {"orders": "unheard"}
    assert Run.objects.get(pk=heard_until_t0.pk).state == "running"
    pipeline = Pipeline.objects.get(name="orders")
    assert "does not answer" in pipeline.status_message
    assert "it is not killed" in pipeline.status_message
    # The web app answers again: the driver is still silent, so now it is lost.
    settings.CONTROLPLANE_URL = heard_until_t0.listening_url
    reconciler._ingestion.update(checked=float("-inf"))
    assert reconciler.tick(T0 + timedelta(seconds=40))["actions"] == {"orders": "lost-heartbeat"}
    assert Pipeline.objects.get(name="orders").status_message == ""


@pytest.fixture
def black_hole_url():
    """A port where nothing listens: the web app is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
