"""Starting, stopping and observing driver processes on this host.

A run's directory holds what the job needs (`run.json`, mode 0600: it carries connection
secrets) and what it leaves behind (`driver.log`, `exit.json`). The driver runs under
`jobs.supervise`, detached from the Celery worker that launched it, so restarting the control
plane neither kills nor orphans it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pyspark
from django.conf import settings

from controlplane.accounts.models import digest
from controlplane.definitions.models import Pipeline, Run
from jobs.connections import kafka_client_config
from jobs.files import write_private
from jobs.jvm import spark_jars

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
        "postgres": sink_conninfo(sink),
        "checkpoint": str(settings.CONTROLPLANE_CHECKPOINT_ROOT / pipeline.name),
        "run_dir": str(run_dir),
        "control_plane": {
            "url": settings.CONTROLPLANE_URL,
            "run_id": run.pk,
            "token": token,
            "heartbeat_seconds": settings.CONTROLPLANE_HEARTBEAT_SECONDS,
        },
    }


def sink_conninfo(sink) -> dict:
    """The sink's connection arguments, checked again at every launch against the DSN
    allow-list and the control plane's own database (either may have changed since the
    connection was saved)."""
    from controlplane.connections.policy import postgres_connect_arguments

    try:
        return postgres_connect_arguments(sink.settings, sink.get_secrets())
    except ValueError as exc:
        raise SinkRefused(f"SinkRefused: connection {sink.name!r}: settings.dsn {exc}") from None


class SinkRefused(RuntimeError):
    """The sink connection may not be used; a definition error, not worth retrying."""


def this_host() -> str:
    return socket.gethostname()


class OtherHost(RuntimeError):
    """The run's driver is on another host: this control plane can neither see nor signal it
    (several hosts are not supported yet)."""


def prepare(run: Run) -> str:
    """Before any process exists: the run's directory, host, log path and token digest are
    set on `run` (the caller saves them with the run row, committed before the launch);
    returns the token itself, which only the driver gets (in run.json)."""
    root = settings.CONTROLPLANE_RUNS_ROOT / run.pipeline.name
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_dir = root / f"{run.generation:06d}"
    suffix = 1
    while True:
        try:
            run_dir.mkdir(mode=0o700)
            break
        except FileExistsError:
            # Left by an earlier pipeline of the same name (deleted and created again): its
            # exit.json must not be taken for this run's.
            suffix += 1
            run_dir = root / f"{run.generation:06d}.{suffix}"
    # The driver's own credential for its reports; only the digest is stored.
    token = secrets.token_urlsafe(32)
    run.token_digest = digest(token)
    run.host = this_host()
    run.run_dir = str(run_dir)
    run.log_path = str(run_dir / "driver.log")
    return token


# What a driver's environment may hold from the launching worker's (names, or prefixes
# ending in "*"); CONTROLPLANE_DRIVER_ENV adds more. The worker's own secrets (database,
# broker, Django and secrets keys) are never passed on: run.json is the job's configuration.
DRIVER_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR",
    "JAVA_HOME", "SPARK_HOME", "SPARK_CONF_DIR", "SPARK_LOCAL_DIRS", "HADOOP_CONF_DIR",
)  # fmt: skip
NEVER_TO_DRIVERS = (
    "DATABASE_URL", "DJANGO_*", "CELERY_*", "CONTROLPLANE_SECRETS_*", "SPARK_LOCAL_IP",
)  # fmt: skip


def _named(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def driver_env(environ=None) -> dict[str, str]:
    """The driver's environment: the allow-listed part of ours, and the Python and bind
    address Spark is to use."""
    environ = os.environ if environ is None else environ
    allowed = (*DRIVER_ENV, *settings.CONTROLPLANE_DRIVER_ENV)
    env = {
        name: value
        for name, value in environ.items()
        if _named(name, allowed) and not _named(name, NEVER_TO_DRIVERS)
    }
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    host = settings.CONTROLPLANE_SPARK_UI_HOST
    if host and host != "*":
        # Spark binds its UI (and the driver's RPC endpoint) to SPARK_LOCAL_IP, else to
        # every interface.
        env["SPARK_LOCAL_IP"] = host
    return env


def launch(run: Run, token: str) -> Run:
    """Start the run's driver. `prepare` came first and the run row holding what it set is
    committed, so the driver is known (and its reports fenced) from its first moment. Fills
    in pid and process_started (not saved)."""
    pipeline = run.pipeline
    run_dir = Path(run.run_dir)
    settings.CONTROLPLANE_CHECKPOINT_ROOT.mkdir(parents=True, exist_ok=True)
    write_private(run_dir / "run.json", json.dumps(run_config(pipeline, run, run_dir, token)))
    command = [
        sys.executable, "-m", "jobs.supervise", "--detach", str(run_dir), "--",
        spark_submit(),
        "--master", settings.SPARK_MASTER,
        "--driver-memory", settings.SPARK_DRIVER_MEMORY,
        "--name", f"pipeline:{pipeline.name}",
        "--conf", "spark.ui.showConsoleProgress=false",
        "--conf", "spark.ui.killEnabled=false",
        *([] if settings.CONTROLPLANE_SPARK_UI_ENABLED else ["--conf", "spark.ui.enabled=false"]),
        "--conf", f"spark.pyspark.python={sys.executable}",
        # jobs/java/build/jars: the sink's JVM writer with the JDBC driver (without them it
        # writes from Python) and Spark's Kafka connector.
        *(["--jars", ",".join(jars)] if (jars := spark_jars()) else []),
        str(JOB_SCRIPT), str(run_dir),
    ]  # fmt: skip
    run.pid = spawn(command, driver_env())
    run.process_started = process_started(run.pid)
    return run


def spawn(command: list[str], env: dict[str, str]) -> int:
    """Start the detached supervisor; returns its pid."""
    # The command is built from settings and paths, never from request input.
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
    return int(result.stdout.strip())


def process_started(pid: int) -> float | None:
    """The process's start time (its identity, with the pid); None if it is gone already."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def request_stop(run: Run) -> None:
    """Ask the driver to finish its batch in flight and stop (it polls for this file)."""
    Path(run.run_dir, "stop").touch()


def kill(run: Run) -> None:
    """Kill the supervisor's process group (spark-submit, the JVM and its Python workers),
    and whatever the run started that outlived it. Only processes proven to be the run's: the
    supervisor by pid and start time (a pid is reused, after a reboot say), the others by
    their command line naming the run's directory. Raises OtherHost for a run elsewhere."""
    _this_host_only(run, "kill")
    if _supervisor(run) is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(run.pid, signal.SIGKILL)
    for stray in _strays(run):
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            if os.getpgid(stray) == stray:
                os.killpg(stray, signal.SIGKILL)
            else:
                os.kill(stray, signal.SIGKILL)


def _this_host_only(run: Run, what: str) -> None:
    if run.host and run.host != this_host():
        raise OtherHost(
            f"run {run.generation} of pipeline {run.pipeline.name!r} is on host {run.host}, "
            f"not {this_host()}: cannot {what} it from here"
        )


# Start times of one process as read twice may differ by clock-tick rounding and boot-time
# adjustment; a reused pid is a process started long after ours.
START_TIME_TOLERANCE = 1.0


def _supervisor(run: Run) -> psutil.Process | None:
    """The run's supervisor if it still runs: pid and start time both match."""
    if not run.pid:
        return None
    try:
        process = psutil.Process(run.pid)
    except psutil.Error:
        return None
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        if run.process_started is not None and (
            abs(process.create_time() - run.process_started) > START_TIME_TOLERANCE
        ):
            return None  # another process has that pid now
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return process  # it exists; whether it is ours cannot be told, as before
    return process


def _strays(run: Run) -> list[int]:
    """Processes of this run (its supervisor, spark-submit's JVM, the Python driver) found
    by their command line: it names the supervisor or the job script, and the run's
    directory. What a lost launch or a dead supervisor left behind."""
    if not run.run_dir:
        return []
    run_dir = os.path.normpath(run.run_dir)
    found = []
    for process in psutil.process_iter(["cmdline"]):
        args = process.info.get("cmdline") or []
        if process.pid == os.getpid() or run_dir not in (os.path.normpath(a) for a in args):
            continue
        if "jobs.supervise" in args or any(a.endswith("jobs/run.py") for a in args):
            found.append(process.pid)
    return found


def exit_report(run: Run) -> dict | None:
    """What the supervisor wrote when the driver exited, or None while it runs."""
    try:
        return json.loads(Path(run.run_dir, "exit.json").read_text())
    except (OSError, ValueError):
        return None


def alive(run: Run) -> bool | None:
    """Whether the run's supervisor still runs (pid and start time match); None when the
    run has no pid yet or is on another host."""
    if not run.pid or (run.host and run.host != this_host()):
        return None
    return _supervisor(run) is not None
