"""What a driver must not hold: the control plane's own secrets in its environment, and a
Spark UI listening beyond this host (security issue #12, defence in depth). Checked on the
stand-in drivers of test_driver_isolation.py and on a real Spark driver in
test_launch_and_stop.py (a real driver costs ~20 s and 1 GB).
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path

import psutil

from controlplane.definitions.models import Run

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
