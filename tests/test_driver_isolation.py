"""The driver's environment and its Spark UI (security issue #12, defence in depth).

A driver runs user-defined SQL next to connection secrets it needs; it must not also hold
the control plane's own (its database, broker, Django and secrets keys), and its Spark UI
(with its kill links) must not listen beyond this host unless configured to.

The real Spark driver's processes are checked by `assert_driver_isolated`, called from the
real-driver test in test_launch_and_stop.py (a real driver costs ~20 s and 1 GB).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path

import psutil
from django.utils import timezone

from controlplane.definitions.models import Run
from controlplane.supervision import launcher
from tests.test_supervision import standin, step  # noqa: F401
from tests.waiting import wait_for

# What the Celery worker holds and no driver may: fake values, set by the tests.
SECRETS = {
    "DATABASE_URL": "postgresql://cp:fake-db-password@db.invalid/controlplane",
    "DJANGO_SECRET_KEY": "fake-django-secret-key",
    "CONTROLPLANE_SECRETS_KEY": "fake-secrets-key",
    "CELERY_BROKER_URL": "redis://:fake-broker-password@broker.invalid/0",
}


def plant_secrets(monkeypatch) -> None:
    """Every one of them set in our environment (what the launcher could pass on); one that
    is set already keeps its value (the test's broker and database stay in use)."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, os.environ.get(name) or value)


def leaked(environ: dict) -> set[str]:
    """Secret names, or secret values under any name, found in a process environment."""
    found = {name for name in SECRETS if name in environ}
    values = {os.environ.get(name) or value for name, value in SECRETS.items()}
    found |= {name for name, value in environ.items() if value in values}
    return found


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


def test_a_launched_driver_holds_none_of_the_control_plane_s_secrets(api, standin, settings):  # noqa: F811
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


def driver_processes(run: Run) -> tuple[psutil.Process, psutil.Process]:
    """The spark-submit JVM (the driver JVM, in client mode) and the Python driver program
    of a real run: members of its supervisor's process group."""
    jvm = python = None
    for process in psutil.process_iter(["cmdline"]):
        try:
            if os.getpgid(process.pid) != run.pid or process.pid == run.pid:
                continue
        except OSError:
            continue
        args = process.info["cmdline"] or []
        if any("SparkSubmit" in a for a in args):
            jvm = process
        elif any(a.endswith("jobs/run.py") for a in args) and "python" in Path(args[0]).name:
            python = process
    assert jvm is not None and python is not None, "the driver's JVM and Python program"
    return jvm, python


def ui_port(run: Run) -> int:
    """The Spark UI's port, as the driver logged it."""
    log = Path(run.log_path).read_text(errors="replace")
    found = re.findall(r"Successfully started service 'SparkUI' on port (\d+)", log)
    assert found, "the driver did not log its Spark UI port"
    return int(found[-1])


def assert_driver_isolated(run: Run) -> None:
    """A real driver (its JVM and Python program) holds none of the control plane's
    secrets (planted with `plant_secrets` before its launch), and its Spark UI listens on
    loopback only."""
    jvm, python = driver_processes(run)
    for process in (psutil.Process(run.pid), jvm, python):
        environ = process.environ()
        assert not leaked(environ), (process.cmdline()[:3], leaked(environ))
    port = ui_port(run)
    listening = [
        c.laddr
        for c in jvm.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert listening, f"nothing of the JVM listens on the UI's port {port}"
    for address in listening:
        ip = ipaddress.ip_address(address.ip)
        ip = getattr(ip, "ipv4_mapped", None) or ip
        assert ip.is_loopback, f"the Spark UI listens on {address.ip}:{port}"
