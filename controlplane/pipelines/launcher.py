"""Starting, stopping and observing driver processes on this host.

A run's directory holds what the job needs (`run.json`, mode 0600: it carries connection
secrets) and what it leaves behind (`driver.log`, `exit.json`). The driver runs under
`jobs.supervise`, detached from the Celery worker that launched it, so restarting the control
plane neither kills nor orphans it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pyspark
from django.conf import settings

from controlplane.accounts.models import digest
from jobs.connections import kafka_client_config, postgres_conninfo
from jobs.files import write_private
from jobs.jvm import spark_jars

from .models import Pipeline, Run

JOB_SCRIPT = Path(settings.BASE_DIR) / "jobs" / "run.py"


def spark_submit() -> str:
    return settings.SPARK_SUBMIT or str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def run_config(pipeline: Pipeline, run: Run, run_dir: Path, token: str) -> dict:
    spec = pipeline.spec
    source = pipeline.connections.get(name=spec["source"]["connection"])
    sink = pipeline.connections.get(name=spec["sink"]["connection"])
    return {
        "pipeline": pipeline.name,
        "generation": run.generation,
        "spec_version": run.spec_version,
        "spec": spec,
        "kafka": kafka_client_config(source.settings, source.get_secrets()),
        "postgres": postgres_conninfo(sink.settings, sink.get_secrets()),
        "checkpoint": str(settings.CONTROLPLANE_CHECKPOINT_ROOT / pipeline.name),
        "run_dir": str(run_dir),
        "control_plane": {
            "url": settings.CONTROLPLANE_URL,
            "run_id": run.pk,
            "token": token,
            "heartbeat_seconds": settings.CONTROLPLANE_HEARTBEAT_SECONDS,
        },
    }


def launch(run: Run) -> Run:
    """Start the run's driver; fills in host, pid, run_dir, log_path, token (not saved)."""
    pipeline = run.pipeline
    run_dir = settings.CONTROLPLANE_RUNS_ROOT / pipeline.name / f"{run.generation:06d}"
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    settings.CONTROLPLANE_CHECKPOINT_ROOT.mkdir(parents=True, exist_ok=True)
    # The driver's own credential for its reports; only the digest is stored.
    token = secrets.token_urlsafe(32)
    run.token_digest = digest(token)
    write_private(run_dir / "run.json", json.dumps(run_config(pipeline, run, run_dir, token)))
    command = [
        sys.executable, "-m", "jobs.supervise", "--detach", str(run_dir), "--",
        spark_submit(),
        "--master", settings.SPARK_MASTER,
        "--driver-memory", settings.SPARK_DRIVER_MEMORY,
        "--name", f"pipeline:{pipeline.name}",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", f"spark.pyspark.python={sys.executable}",
        # The sink's JVM writer and the JDBC driver; without them it writes from Python.
        *(["--jars", ",".join(jars)] if (jars := spark_jars()) else []),
        str(JOB_SCRIPT), str(run_dir),
    ]  # fmt: skip
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # jobs never see Django
    # The command is built here from settings and paths, never from request input.
    result = subprocess.run(  # noqa: S603
        command,
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise RuntimeError(f"could not start the supervisor: {result.stderr.strip()[-2000:]}")
    run.pid = int(result.stdout.strip())
    run.host = socket.gethostname()
    run.run_dir = str(run_dir)
    run.log_path = str(run_dir / "driver.log")
    return run


def request_stop(run: Run) -> None:
    """Ask the driver to finish its batch in flight and stop (it polls for this file)."""
    Path(run.run_dir, "stop").touch()


def kill(run: Run) -> None:
    """Kill the supervisor's process group: spark-submit, the JVM and its Python workers."""
    if run.pid and run.host == socket.gethostname():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)


def exit_report(run: Run) -> dict | None:
    """What the supervisor wrote when the driver exited, or None while it runs."""
    try:
        return json.loads(Path(run.run_dir, "exit.json").read_text())
    except (OSError, ValueError):
        return None


def alive(run: Run) -> bool | None:
    """Whether the supervisor still runs; None when the run is on another host."""
    if not run.pid or run.host != socket.gethostname():
        return None
    try:
        os.kill(run.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
