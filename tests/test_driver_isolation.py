"""The driver's environment and its Spark UI (security issue #12, defence in depth).

A driver runs user-defined SQL next to connection secrets it needs; it must not also hold
the control plane's own (its database, broker, Django and secrets keys), and its Spark UI
(with its kill links) must not listen beyond this host unless configured to.

The real Spark driver's processes are checked by `assert_driver_isolated` (tests/isolation.py),
called from the real-driver test in test_launch_and_stop.py (a real driver costs ~20 s and
1 GB).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil
from django.utils import timezone

from controlplane.definitions.models import Run
from controlplane.supervision import launcher
from tests.isolation import leaked, plant_secrets
from tests.runs import step
from tests.waiting import wait_for


def test_the_driver_environment_is_an_allow_list(monkeypatch, settings):
    plant_secrets(monkeypatch)
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-drivers")
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    env = launcher.driver_env()
    assert not leaked(env)
    assert "AWS_SECRET_ACCESS_KEY" not in env and "DJANGO_SETTINGS_MODULE" not in env
    assert env["PATH"] == os.environ["PATH"] and env["LC_TIME"] == "C.UTF-8"
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"  # the UI listens on loopback by default
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"]

    # More can be passed on by name or prefix; the control plane's secrets never.
    settings.CONTROLPLANE_DRIVER_ENV = ["AWS_*", "DATABASE_URL", "DJANGO_*", "CELERY_*"]
    settings.CONTROLPLANE_SPARK_UI_HOST = "*"
    env = launcher.driver_env()
    assert env["AWS_SECRET_ACCESS_KEY"] == "not-for-drivers"
    assert not leaked(env)
    assert "SPARK_LOCAL_IP" not in env  # "*": Spark's default, every interface


def test_a_launched_driver_holds_none_of_the_control_plane_s_secrets(api, standin, settings):
    """The supervisor and the driver it starts (a stand-in for spark-submit here), as
    really launched: their environments as the kernel has them, and their command line."""
    plant_secrets(standin)
    standin.setenv("STANDIN_MODE", "silent")
    settings.CONTROLPLANE_SPARK_UI_ENABLED = False
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    assert step(timezone.now()) == "start"
    run = Run.objects.get(pipeline__name="orders")
    driver_json = Path(run.run_dir, "driver.json")
    assert wait_for(driver_json.exists)
    driver = psutil.Process(json.loads(driver_json.read_text())["pid"])
    for process in (psutil.Process(run.pid), driver):
        environ = process.environ()
        assert not leaked(environ), (process.cmdline(), leaked(environ))
        assert environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    args = driver.cmdline()
    assert "spark.ui.killEnabled=false" in args and "spark.ui.enabled=false" in args
    assert oct(Path(run.run_dir, "run.json").stat().st_mode & 0o777) == "0o600"
    launcher.kill(run)
