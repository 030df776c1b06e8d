"""Starting, stopping and observing driver processes on this host.

A run's directory holds what the job needs (`run.json`, mode 0600: it carries connection
secrets) and what it leaves behind (`driver.log`, `exit.json`). The driver runs under
`jobs.supervise`, detached from the Celery worker that launched it, so restarting the control
plane neither kills nor orphans it.

A run in a shared Spark application has the same directory and files, but no process of its
own: it is assigned to the application's driver (`jobs/host.py`) by a file in the
application's queue, and killed by a file in its run directory (the application's process is
its supervisor: `pid` names it). An application's directory holds `app.json`, its
`driver.log`, `ready.json` once its Spark session is up, and `exit.json` when it ended.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import psutil
import pyspark
from django.conf import settings

from controlplane.accounts.models import digest
from controlplane.definitions import checkpoints
from controlplane.definitions.models import Pipeline, Run, SparkApplication
from jobs import hadoop
from jobs.connections import kafka_client_config
from jobs.files import write_private
from jobs.jvm import driver_conf, spark_jars
from jobs.spec import parse_spec
from jobs.supervise import write_json

from . import offsets

JOB_SCRIPT = Path(settings.BASE_DIR) / "jobs" / "run.py"
HOST_SCRIPT = Path(settings.BASE_DIR) / "jobs" / "host.py"
# Under the runs root, beside the pipelines' directories (whose names have no underscore).
APPLICATIONS_DIR = "_applications"

# Spark settings for drivers that run small batches all day: bounded UI and listener-bus
# state (a UI that keeps every batch's jobs grows without end), periodic cleanup.
LONG_RUNNING_CONF = {
    "spark.ui.showConsoleProgress": "false",
    "spark.ui.killEnabled": "false",
    "spark.ui.retainedJobs": "200",
    "spark.ui.retainedStages": "200",
    "spark.ui.retainedTasks": "20000",
    "spark.sql.ui.retainedExecutions": "100",
    "spark.sql.streaming.ui.retainedQueries": "100",
    "spark.sql.streaming.ui.retainedProgressUpdates": "20",
    "spark.sql.streaming.numRecentProgressUpdates": "20",
    "spark.scheduler.listenerbus.eventqueue.capacity": "20000",
}
# A shared application: members share the driver's scheduler fairly (a pool each), and a
# query asked to stop is waited for at most this long before the member reports it stuck.
SHARED_CONF = {
    "spark.scheduler.mode": "FAIR",
    "spark.sql.streaming.stopTimeout": "10000",
}
# Spark settings an operator may give a shared application (exact names, or prefixes ending
# in "."): memory, parallelism and SQL/streaming tuning; nothing that starts agents, loads
# classes or files, or changes where the driver listens.
APPLICATION_CONF_ALLOWED = (
    "spark.executor.memory", "spark.executor.cores", "spark.executor.instances",
    "spark.cores.max", "spark.default.parallelism", "spark.memory.fraction",
    "spark.memory.storageFraction", "spark.driver.maxResultSize", "spark.task.cpus",
    "spark.sql.shuffle.partitions", "spark.sql.adaptive.", "spark.sql.streaming.",
    "spark.scheduler.listenerbus.eventqueue.capacity", "spark.ui.retained",
    "spark.sql.ui.retainedExecutions", "spark.locality.wait", "spark.network.timeout",
    "spark.python.worker.reuse", "spark.python.worker.memory",
)  # fmt: skip
APPLICATION_CONF_REFUSED = (
    "spark.sql.streaming.ui.enabled", "spark.sql.streaming.stopTimeout",
    "spark.sql.streaming.checkpointLocation", "spark.sql.streaming.stateStore.providerClass",
    "spark.sql.streaming.fileSink.", "spark.sql.streaming.metricsEnabled",
)  # fmt: skip


# Whatever names a class, plugin, extension or listener makes the JVM load code by name.
LOADS_CODE = ("class", "plugin", "extension", "listener", "agent", "codec")


def conf_problem(key: str) -> str | None:
    """Why a shared application may not be given Spark setting `key`, or None."""
    if key in APPLICATION_CONF_ALLOWED:
        return None
    if any(word in key.lower() for word in LOADS_CODE):
        return "names code for the JVM to load: not a setting a shared application may be given"
    if any(key == r or (r.endswith(".") and key.startswith(r)) for r in APPLICATION_CONF_REFUSED):
        return "is set by the control plane"
    if any(key == a or (a.endswith(".") and key.startswith(a)) for a in APPLICATION_CONF_ALLOWED):
        return None
    if key.startswith("spark.ui.retained"):
        return None
    return "is not a setting a shared application may be given"


def _conf_value(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _conf_args(conf: dict[str, str]) -> list[str]:
    return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]


def spark_submit() -> str:
    return settings.SPARK_SUBMIT or str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def run_config(pipeline: Pipeline, run: Run, run_dir: Path, token: str) -> dict:
    spec = pipeline.spec
    reset = offsets.start_offsets_for_launch(pipeline)
    if reset:
        # An operator reset its offsets: the new checkpoint starts there.
        spec = {**spec, "source": {**spec["source"], "starting_offsets": reset}}
    source = pipeline.connections.get(name=spec["source"]["connection"])
    # The spec as stored (validated then); a definition stored by an earlier version that
    # this one refuses fails the launch here, naming the field (a permanent failure).
    parsed = parse_spec(spec)
    sink_configs = [sink_config(pipeline, sink) for sink in parsed.all_sinks()]
    first = sink_configs[0]
    registry = None
    if parsed.source.schema_registry is not None:
        connection = pipeline.connections.get(name=parsed.source.schema_registry.connection)
        registry = DRIVER_ARGUMENTS[connection.kind](connection)
    return {
        "pipeline": pipeline.name,
        "generation": run.generation,
        "spec_version": run.spec_version,
        "spec": spec,
        "kafka": kafka_client_config(source.settings, source.get_secrets()),
        "postgres": first.get("postgres") or {},
        "sink_kafka": first.get("kafka"),
        "sink_configs": sink_configs,
        "registry": registry,
        "checkpoint": checkpoints.location(pipeline),
        # Where checkpoints live and how to reach that store (keys included: this file is
        # 0600, like the connections' secrets above).
        "storage": checkpoints.for_driver(),
        "run_dir": str(run_dir),
        "control_plane": {
            "url": settings.CONTROLPLANE_URL,
            "run_id": run.pk,
            "token": token,
            "heartbeat_seconds": settings.CONTROLPLANE_HEARTBEAT_SECONDS,
        },
    }


def sink_config(pipeline: Pipeline, sink: Any) -> dict:
    """One sink's connection arguments, each connection it writes through under its kind:
    {"postgres": psycopg arguments}, {"kafka": client arguments}, {"files": {"root": URI}},
    {"cassandra": ..., "kafka": ...} (a cassandra sink and its dead letters' topic)..."""
    out = {}
    for name in sink.connection_names():
        connection = pipeline.connections.get(name=name)
        out[connection.kind] = DRIVER_ARGUMENTS[connection.kind](connection)
    return out


def sink_files_root(sink) -> str:
    """A files sink's root URI, checked again at every launch against the connection policy
    (local roots under CONTROLPLANE_FILES_DIR, never the control plane's own directories),
    which may have changed since the connection was saved."""
    from controlplane.connections.policy import files_connection_root

    try:
        return files_connection_root(sink.settings)
    except ValueError as exc:
        raise SinkRefused(f"SinkRefused: connection {sink.name!r}: settings.root {exc}") from None


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
    """This control-plane host's name (CONTROLPLANE_HOST_NAME, by default the machine's)."""
    return settings.CONTROLPLANE_HOST_NAME


class OtherHost(RuntimeError):
    """The process is on another host: it can be seen and signalled only there (work on it
    is sent to that host's queue, controlplane.supervision.hosts)."""


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
    # A member of a shared application writes into its application's log.
    log_dir = Path(run.application.app_dir) if run.application_id else run_dir
    run.log_path = str(log_dir / "driver.log")
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
    # Who the driver is to HDFS (simple authentication reads it before any Spark setting).
    env.update(hadoop.driver_env(checkpoints.for_driver()))
    host = settings.CONTROLPLANE_SPARK_UI_HOST
    if host and host != "*":
        # Spark binds its UI (and the driver's RPC endpoint) to SPARK_LOCAL_IP, else to
        # every interface.
        env["SPARK_LOCAL_IP"] = host
    return env


def launch(run: Run, token: str) -> Run:
    """Start the run's driver. `prepare` came first and the run row holding what it set is
    committed, so the driver is known (and its reports fenced) from its first moment. Fills
    in pid and process_started (not saved). A run placed in a shared application is
    assigned to it instead."""
    if run.application_id is not None:
        return assign(run, token)
    pipeline = run.pipeline
    run_dir = Path(run.run_dir)
    checkpoints.ensure_root()
    write_private(run_dir / "run.json", json.dumps(run_config(pipeline, run, run_dir, token)))
    command = [
        sys.executable, "-m", "jobs.supervise", "--detach", str(run_dir), "--",
        spark_submit(),
        "--master", settings.SPARK_MASTER,
        "--driver-memory", settings.SPARK_DRIVER_MEMORY,
        "--name", f"pipeline:{pipeline.name}",
        *_common_args(settings.SPARK_MASTER),
        str(JOB_SCRIPT), str(run_dir),
    ]  # fmt: skip
    run.pid = spawn(command, driver_env())
    run.process_started = process_started(run.pid)
    return run


def _common_args(master: str) -> list[str]:
    return [
        *_python_files(master),
        *_conf_args(LONG_RUNNING_CONF),
        # The class-data archive is made for pip's pyspark's spark-submit (jobs.jvm).
        *_conf_args(driver_conf(class_archive=not settings.SPARK_SUBMIT)),
        *([] if settings.CONTROLPLANE_SPARK_UI_ENABLED else ["--conf", "spark.ui.enabled=false"]),
        "--conf", f"spark.pyspark.python={sys.executable}",
        # jobs/java/build/jars: the sink's JVM writer with the JDBC driver (without them it
        # writes from Python) and Spark's Kafka connector.
        *(["--jars", ",".join(jars)] if (jars := spark_jars()) else []),
    ]  # fmt: skip


def _python_files(master: str) -> list[str]:
    """Executors outside the driver's JVM (any master but local) import our job code from
    an archive Spark ships to them; in local mode Python workers find it where the driver
    does."""
    if master.startswith("local"):
        return []
    return ["--py-files", str(jobs_archive())]


def jobs_archive() -> Path:
    """jobs/ (its Python modules) as a zip for --py-files, one per content: a driver
    launched while jobs/ changes gets a whole archive, never a half-written one."""
    root = Path(settings.BASE_DIR)
    sources = sorted((root / "jobs").rglob("*.py"))
    content = hashlib.sha256()
    for path in sources:
        content.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    folder = settings.CONTROLPLANE_RUNS_ROOT / "_jobs"
    archive = folder / f"jobs-{content.hexdigest()[:16]}.zip"
    if archive.is_file():
        return archive
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sources:
            if "__pycache__" not in path.parts:
                out.write(path, path.relative_to(root).as_posix())
    partial.replace(archive)
    return archive


def assign(run: Run, token: str) -> Run:
    """Hand the run to its shared application (`run.application`, whose process runs): its
    run.json, then the assignment in the application's queue, which its driver picks up
    within a fraction of a second. The application's supervisor stands for the run's
    process (pid and start time), so the run is seen to end with it."""
    app = run.application
    run_dir = Path(run.run_dir)
    checkpoints.ensure_root()
    write_private(run_dir / "run.json", json.dumps(run_config(run.pipeline, run, run_dir, token)))
    write_json(_assignment(run), {"run_dir": str(run_dir)})
    run.pid = app.pid
    run.process_started = app.process_started
    return run


def _assignment(run: Run) -> Path:
    return (
        Path(run.application.app_dir) / "queue" / f"{run.pipeline.name}-{run.generation:06d}.json"
    )


def _cancel_assignment(run: Run) -> bool:
    """Take back an assignment its application has not claimed yet (claiming renames it):
    True if it was still unclaimed, so the query was never started."""
    if not run.application.app_dir:
        return True
    assignment = _assignment(run)
    try:
        assignment.rename(assignment.with_name(assignment.name + ".cancelled"))
    except FileNotFoundError:
        # Claimed (it ends with exit.json, written before the claim is removed), or never
        # written (a launch that died between run.json and the assignment).
        claimed = assignment.with_name(assignment.name + ".taken")
        return not (claimed.exists() or exit_reported(run.run_dir))
    return True


# -- shared applications ------------------------------------------------------------------


def prepare_application(app: SparkApplication, generation: int) -> str:
    """A fresh directory for the application's process of `generation` (set on `app`, with
    host and token digest; the caller saves them before launching); returns the token."""
    root = settings.CONTROLPLANE_RUNS_ROOT / APPLICATIONS_DIR / app.name
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    app_dir = root / f"{generation:06d}"
    suffix = 1
    while True:
        try:
            app_dir.mkdir(mode=0o700)
            break
        except FileExistsError:  # left by an earlier application of the same name
            suffix += 1
            app_dir = root / f"{generation:06d}.{suffix}"
    (app_dir / "queue").mkdir(mode=0o700)
    token = secrets.token_urlsafe(32)
    app.token_digest = digest(token)
    app.host = this_host()
    app.app_dir = str(app_dir)
    return token


def launch_application(app: SparkApplication, token: str) -> SparkApplication:
    """Start the application's driver (`jobs/host.py`) under a detached supervisor, which
    reports its exit to /api/applications/{name}/exit/. Fills in pid and process_started."""
    app_dir = Path(app.app_dir)
    base = settings.CONTROLPLANE_URL.rstrip("/")
    write_private(
        app_dir / "app.json",
        json.dumps(
            {
                "name": app.name,
                "generation": app.generation,
                "storage": checkpoints.for_driver(),
                "control_plane": {
                    "exit_url": f"{base}/api/applications/{app.name}/exit/",
                    "reports_url": f"{base}/api/applications/{app.name}/reports/",
                    "token": token,
                },
            }
        ),
    )
    given = {k: _conf_value(v) for k, v in app.conf.items() if not conf_problem(k)}
    conf = {**SHARED_CONF, **given}
    if app.executor_memory:
        conf["spark.executor.memory"] = app.executor_memory
    master = app.master or settings.SPARK_APPLICATION_MASTER
    command = [
        sys.executable, "-m", "jobs.supervise", "--detach", str(app_dir), "--",
        spark_submit(),
        "--master", master,
        "--driver-memory", app.driver_memory or settings.SPARK_DRIVER_MEMORY,
        "--name", f"application:{app.name}",
        *_common_args(master),
        *_conf_args(conf),
        str(HOST_SCRIPT), str(app_dir),
    ]  # fmt: skip
    app.pid = spawn(command, driver_env())
    app.process_started = process_started(app.pid)
    return app


def application_ready(app: SparkApplication) -> bool:
    """Whether the application's Spark session is up (its driver takes members)."""
    return bool(app.app_dir) and Path(app.app_dir, "ready.json").exists()


def application_exit_report(app: SparkApplication) -> dict | None:
    try:
        return json.loads(Path(app.app_dir, "exit.json").read_text())
    except (OSError, ValueError):
        return None


def application_alive(app: SparkApplication) -> bool | None:
    """Whether the application's supervisor still runs; None without a process here."""
    if not app.pid or (app.host and app.host != this_host()):
        return None
    return _process(app.pid, app.process_started) is not None


def request_application_stop(app: SparkApplication) -> None:
    """Ask the driver to stop every member gracefully, then itself."""
    Path(app.app_dir, "stop").touch()


def kill_application(app: SparkApplication) -> None:
    """Kill the application's process tree (its supervisor's group), and whatever of it
    outlived its supervisor (found by the application's directory on its command line)."""
    if app.host and app.host != this_host():
        raise OtherHost(f"application {app.name!r} is on host {app.host}, not {this_host()}")
    _kill_tree(app.pid, app.process_started, app.app_dir, HOST_SCRIPT.name)


def measure(app: SparkApplication) -> tuple[int, float] | None:
    """Resident memory (bytes) and CPU time (seconds) of the application's whole process
    tree (supervisor, JVM, Python driver and workers); None if it does not run here."""
    process = _process(app.pid, app.process_started) if app.pid else None
    if process is None:
        return None
    rss, cpu = 0, 0.0
    for p in [process, *_children(process)]:
        with contextlib.suppress(psutil.Error):
            rss += p.memory_info().rss
            times = p.cpu_times()
            cpu += times.user + times.system + times.children_user + times.children_system
    return rss, cpu


def _children(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


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


def kill(run: Run) -> bool:
    """Kill the run's driver. A dedicated run: kill the supervisor's process group
    (spark-submit, the JVM and its Python workers), and whatever the run started that
    outlived it; only processes proven to be the run's: the supervisor by pid and start time
    (a pid is reused, after a reboot say), the others by their command line naming the run's
    directory. Returns True: it is gone. A run in a shared application: ask the application
    to stop its query at once, and return False: it is gone once the application says so
    (exit.json). Raises OtherHost for a run elsewhere."""
    _this_host_only(run, "kill")
    if run.application_id is not None:
        if run.run_dir:
            Path(run.run_dir, "kill").touch()
        if _cancel_assignment(run) or _supervisor(run) is None:
            return True  # never claimed, or its application is gone: so is the query
        return exit_reported(run.run_dir)
    _kill_tree(run.pid, run.process_started, run.run_dir, JOB_SCRIPT.name)
    return True


def _kill_tree(pid: int | None, started: float | None, directory: str, script: str) -> None:
    """Kill a supervisor's process group (the supervisor proven by pid and start time), and
    whatever it started that outlived it (found by `directory` on its command line)."""
    if _process(pid, started) is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for stray in _strays_of(directory, script):
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
    return _process(run.pid, run.process_started) if run.pid else None


def _process(pid: int | None, started: float | None) -> psutil.Process | None:
    """The process `pid` if it runs and started at `started` (a pid is reused)."""
    if not pid:
        return None
    try:
        process = psutil.Process(pid)
    except psutil.Error:
        return None
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        if started is not None and (abs(process.create_time() - started) > START_TIME_TOLERANCE):
            return None  # another process has that pid now
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return process  # it exists; whether it is ours cannot be told, as before
    return process


def _strays_of(directory: str, script: str) -> list[int]:
    """Processes of a run or application (its supervisor, spark-submit's JVM, the Python
    driver) found by their command line: it names the supervisor or the driver script, and
    `directory`. What a lost launch or a dead supervisor left behind."""
    if not directory:
        return []
    directory = os.path.normpath(directory)
    found = []
    for process in psutil.process_iter(["cmdline"]):
        args = process.info.get("cmdline") or []
        if process.pid == os.getpid() or directory not in (os.path.normpath(a) for a in args):
            continue
        if "jobs.supervise" in args or any(a.endswith(f"jobs/{script}") for a in args):
            found.append(process.pid)
    return found


def exit_reported(run_dir: str) -> bool:
    """Whether the supervisor (or the application) wrote the run's exit report."""
    return Path(run_dir, "exit.json").exists()


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


def _kafka_arguments(connection) -> dict:
    return kafka_client_config(connection.settings, connection.get_secrets())


def _cassandra_arguments(connection) -> dict:
    from controlplane.connections.policy import cassandra_connection_arguments

    try:
        return cassandra_connection_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        raise SinkRefused(f"SinkRefused: connection {connection.name!r}: {exc}") from None


def _registry_arguments(connection) -> dict:
    from controlplane.connections.policy import registry_connection_arguments

    try:
        return registry_connection_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        raise SinkRefused(f"SinkRefused: connection {connection.name!r}: {exc}") from None


def _files_arguments(connection) -> dict:
    return {"root": sink_files_root(connection)}


# What a driver is given to reach a connection of each kind (secrets included: the run
# configuration is 0600), checked again against the policy at every launch.
DRIVER_ARGUMENTS = {
    "kafka": _kafka_arguments,
    "postgres": sink_conninfo,
    "files": _files_arguments,
    "cassandra": _cassandra_arguments,
    "schema-registry": _registry_arguments,
}
