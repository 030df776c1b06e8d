"""Recovery after kill -9: how fast a dead driver is noticed, and how fast data flows again;
for a dedicated pipeline and for one in a shared Spark application.

    .venv/bin/python bench/recovery.py [--kills 10 --shared-failures 10 --shared-kills 5]
                                       (after: eval "$(./stack services)")

Runs the control plane for real, on the dev stack's PostgreSQL, Redis and Kafka (in a database
of its own, dropped at the end, and a Redis database of its own, so no other worker takes its
tasks): a web server (drivers' reports, the supervisor's exit report), a Celery worker and
beat (the reconcile tick), and pipelines fed by the load generator, with a fixed-delay policy
of 0 s. The two modes run one after the other, never at once.

Dedicated (its own Spark application, as before): again and again, it SIGKILLs the Spark
driver (the JVM) once the run has committed a batch, and measures from the kill:

  detection   until the control plane has recorded the run as ended
  recovery    until the next run's first batch with records is reported (committed)

next to the Spark driver's own cold start in the same run: from a run's launch to its first
batch with records.

Shared (the pipeline placed in a shared application, `Pipeline.placement`): a SIGKILL of the
JVM there is the loss of the whole application, not a restart of one query, so two figures:

  query failure  the query fails in a real batch (its sink table rejects one record: a CHECK
                 constraint, dropped again as soon as the run's exit is written) and is
                 restarted inside the warm application: from the member's exit (its
                 exit.json) to the next run's first committed batch with records
  JVM kill       SIGKILL of the application's driver JVM: from the kill to the next run's
                 first committed batch with records (the application is launched again)

next to a member's warm start (from its run's launch to its first batch with records), and
each as a ratio to the dedicated figure. The last line is one JSON object with every figure,
also written to bench/results/recovery.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SCHEMA = (
    "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE, lon DOUBLE,"
    " event_time TIMESTAMP"
)
POLICY = {"kind": "fixed-delay", "attempts": 1000, "delay_seconds": 0}
REJECT = "bench_reject"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(predicate, timeout: float, what: str, poll: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def own_redis_db(url: str, db: int) -> str:
    """The broker URL on Redis database `db`: the bench's Celery tasks are its own (the
    tests use 15, `./stack up` 0)."""
    return url.rsplit("/", 1)[0] + f"/{db}" if url.startswith("redis") else url


def start_control_plane(env: dict, workdir: Path, web: str = "runserver") -> list[subprocess.Popen]:
    """The web app (Django's runserver, or gunicorn as `./stack up` serves it), a Celery
    worker and beat, logging into workdir/logs."""
    python = sys.executable
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if web == "gunicorn":
        web_command = [
            python, "-m", "gunicorn", "controlplane.wsgi", "--bind", env["WEB_ADDRESS"],
            "--worker-class", "gthread", "--workers", "2", "--threads", "8",
        ]  # fmt: skip
    else:
        web_command = [python, "manage.py", "runserver", "--noreload", env["WEB_ADDRESS"]]
    commands = {
        "web": web_command,
        "worker": [
            python, "-m", "celery", "-A", "controlplane", "worker",
            "--concurrency", "2", "--loglevel", "INFO",
        ],
        "beat": [
            python, "-m", "celery", "-A", "controlplane", "beat",
            "--loglevel", "INFO", "--schedule", str(workdir / "beat-schedule"),
        ],
    }  # fmt: skip
    processes = []
    for name, command in commands.items():
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        processes.append(
            subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        )
    return processes


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def fail_query(
    run_dir: str, sink_dsn: str, table: str, column: str, send_bad, timeout: float = 120
) -> dict:
    """Make a run's query fail in a real batch: its sink table gets a CHECK constraint that
    rejects `column` = -1 (NOT VALID: rows already there, an earlier injection's, are left
    alone), then `send_bad()` produces one such record; the batch that reads
    it fails (every task attempt), so the query does. The constraint is dropped the moment
    the run's exit is written (RUN_DIR/exit.json: a shared application's member writes it
    when its query ended, a dedicated run's supervisor when the driver exited), so the next
    run writes the record. Returns the wall-clock times of the injection and of the exit
    (exit.json's `ended_at`)."""
    import psycopg
    from psycopg import sql

    exit_path = Path(run_dir, "exit.json")
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({} <> -1) NOT VALID").format(
                sql.Identifier(table), sql.Identifier(REJECT), sql.Identifier(column)
            )
        )
        try:
            injected = time.time()
            send_bad()
            report = wait(lambda: read_json(exit_path), timeout, "the failed run's exit")
        finally:
            conn.execute(
                sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
                    sql.Identifier(table), sql.Identifier(REJECT)
                )
            )
    return {
        "injected_at": injected,
        "ended_at": report["ended_at"],
        "exit_code": report.get("exit_code"),
        "dropped_at": time.time(),
    }


def driver_pid(directory: str) -> int:
    """The driver JVM of a run's or an application's directory (spark-submit execs into it)."""
    return json.loads(Path(directory, "driver.json").read_text())["pid"]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10, help="dedicated: SIGKILLs of the JVM")
    parser.add_argument("--rate", type=float, default=500.0, help="events per second produced")
    parser.add_argument(
        "--shared-failures", type=int, default=10,
        help="shared: query failures, each restarted inside the warm application",
    )  # fmt: skip
    parser.add_argument(
        "--shared-kills", type=int, default=5,
        help="shared: SIGKILLs of the application's JVM (application losses)",
    )  # fmt: skip
    parser.add_argument("--shared-driver-memory", default="2g")
    parser.add_argument("--no-shared", action="store_true", help="the dedicated figures only")
    parser.add_argument("--redis-db", type=int, default=13, help="the Celery broker's database")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "recovery.json"))
    args = parser.parse_args()

    from throughput import machine

    load_start = os.getloadavg()
    suffix = uuid.uuid4().hex[:6]
    workdir = ROOT / "var" / "bench-recovery" / suffix
    port = free_port()
    env = dict(os.environ)
    admin_url = env["DATABASE_URL"]
    database = f"controlplane_bench_{suffix}"
    create_database(admin_url, database)
    env.update(
        DATABASE_URL=admin_url.rsplit("/", 1)[0] + f"/{database}",
        CELERY_BROKER_URL=own_redis_db(env["CELERY_BROKER_URL"], args.redis_db),
        WEB_ADDRESS=f"127.0.0.1:{port}",
        CONTROLPLANE_URL=f"http://127.0.0.1:{port}",
        CONTROLPLANE_RUNS_ROOT=str(workdir / "runs"),
        CONTROLPLANE_CHECKPOINT_ROOT=str(workdir / "checkpoints"),
        CONTROLPLANE_HEARTBEAT_SECONDS="1",
        DJANGO_SETTINGS_MODULE="controlplane.settings",
    )
    os.environ.update(env)
    import django

    django.setup()
    logging.getLogger("kafka").setLevel(logging.WARNING)  # Django's console handler: INFO
    from django.core.management import call_command

    call_command("migrate", verbosity=0)

    from controlplane.connections.models import Connection
    from controlplane.definitions import services
    from controlplane.definitions.models import (
        BatchProgress,
        Pipeline,
        Run,
        RunState,
        SparkApplication,
    )
    from jobs.connections import validate_connection

    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    sink_dsn = env["CONTROLPLANE_SINK_DATABASE_URL"]
    for conn_name, kind, settings in (
        (f"k-{suffix}", "kafka", {"bootstrap_servers": bootstrap}),
        (f"pg-{suffix}", "postgres", {"dsn": sink_dsn}),
    ):
        clean, secrets = validate_connection(kind, settings, {})
        connection = Connection(name=conn_name, kind=kind, settings=clean)
        connection.set_secrets(secrets)
        connection.save()

    def loadgen(topic: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-m", "jobs.loadgen", "--bootstrap", bootstrap, "--topic", topic,
             "--rate", str(args.rate), "--malformed", "0"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait(lambda: _topic_exists(bootstrap, topic), 30, "the topic", poll=0.5)
        return process

    def spec(topic: str, table: str) -> dict:
        return {
            "source": {
                "connection": f"k-{suffix}",
                "topics": [topic],
                "schema": SCHEMA,
                "starting_offsets": "earliest",
            },
            "sink": {"connection": f"pg-{suffix}", "table": table},
            "trigger": {"interval_seconds": 1},
            "restart_policy": POLICY,
        }

    topic, name = f"recovery-{suffix}", f"bench-recovery-{suffix}"
    shared_topic, shared_name = f"recovery-shared-{suffix}", f"bench-recovery-shared-{suffix}"
    app_name = f"recovery-{suffix}"
    tables = [f"recovery_{suffix}", f"recovery_shared_{suffix}"]
    generators = [loadgen(topic)]
    services.create_pipeline(name=name, spec_data=spec(topic, tables[0]), desired_state="running")
    processes = start_control_plane(env, workdir)
    print(f"control plane on port {port}, pipeline {name}, logs in {workdir}", flush=True)

    def first_batch(run: Run):
        row = (
            BatchProgress.objects.filter(run=run, num_input_rows__gt=0)
            .order_by("reported_at")
            .first()
        )
        return row.reported_at if row else None

    def next_run(name: str, run: Run) -> Run:
        """The first run after `run` to commit a batch with records (a run that failed again
        on the way is skipped: counted by the caller from the generations)."""

        def found():
            row = (
                BatchProgress.objects.filter(
                    run__pipeline__name=name,
                    run__generation__gt=run.generation,
                    num_input_rows__gt=0,
                )
                .select_related("run")
                .order_by("reported_at")
                .first()
            )
            return row.run if row else None

        return wait(found, 240, "the next run's first committed batch")

    def stop(name: str) -> None:
        Pipeline.objects.filter(name=name).update(desired_state="stopped")
        wait(
            lambda: (
                not Run.objects.filter(pipeline__name=name, state__in=RunState.active()).exists()
            ),
            120,
            f"{name} to stop",
            poll=0.5,
        )

    detections, recoveries, cold_starts = [], [], []
    shared: dict = {}
    try:
        run = wait(
            lambda: Run.objects.filter(pipeline__name=name, state=RunState.RUNNING).first(),
            180,
            "the first run",
        )
        for kill in range(1, args.kills + 1):
            first = wait(lambda r=run: first_batch(r), 180, "a committed batch")
            run.refresh_from_db()
            cold_starts.append((first - run.created_at).total_seconds())
            pid = driver_pid(run.run_dir)
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            ended = wait(
                lambda r=run: (
                    Run.objects.filter(pk=r.pk, state=RunState.EXITED)
                    .values_list("ended_at", flat=True)
                    .first()
                ),
                120,
                "the death to be recorded",
            )
            detections.append(ended.timestamp() - killed_at)
            run = next_run(name, run)
            recoveries.append(first_batch(run).timestamp() - killed_at)
            print(
                f"kill {kill}: detected in {detections[-1]:.2f} s, next batch committed after"
                f" {recoveries[-1]:.1f} s (cold start of the killed run {cold_starts[-1]:.1f} s)",
                flush=True,
            )
        # The last run's own cold start counts too.
        cold_starts.append((first_batch(run) - run.created_at).total_seconds())
        stop(name)
        generators.pop().terminate()

        if not args.no_shared:
            shared = shared_phase(
                args, app_name, shared_name, shared_topic, tables[1], spec, loadgen, generators,
                sink_dsn, bootstrap, first_batch, next_run,
            )  # fmt: skip
            stop(shared_name)
    finally:
        Pipeline.objects.update(desired_state="stopped")
        SparkApplication.objects.update(desired_state="stopped")
        try:
            wait(
                lambda: (
                    not Run.objects.filter(state__in=RunState.active()).exists()
                    and not SparkApplication.objects.filter(pid__isnull=False).exists()
                ),
                180,
                "the pipelines and the application to stop",
                poll=0.5,
            )
        finally:
            from controlplane.supervision import launcher

            for run in Run.objects.filter(state__in=RunState.active(), application=None):
                launcher.kill(run)
            for app in SparkApplication.objects.filter(pid__isnull=False):
                launcher.kill_application(app)
            for process in [*generators, *processes]:
                process.terminate()
            for process in [*generators, *processes]:
                process.wait(timeout=30)
            from django.db import connections

            connections.close_all()
            drop_database(admin_url, database)
            cleanup_kafka_and_sink(
                bootstrap, [topic, shared_topic], sink_dsn, tables, [name, shared_name]
            )
    figures = {
        "kills": len(detections),
        "detection_median_s": round(statistics.median(detections), 3),
        "detection_max_s": round(max(detections), 3),
        "recovery_median_s": round(statistics.median(recoveries), 2),
        "recovery_max_s": round(max(recoveries), 2),
        "cold_start_median_s": round(statistics.median(cold_starts), 2),
        "cold_start_max_s": round(max(cold_starts), 2),
        "recovery_to_cold_start": round(
            statistics.median(recoveries) / statistics.median(cold_starts), 2
        ),
    }
    print()
    print("dedicated (its own Spark application), kill -9 of the driver JVM:")
    print(
        f"  detection (kill -> control plane knows): median {figures['detection_median_s']} s,"
        f" max {figures['detection_max_s']} s"
    )
    print(
        f"  recovery (kill -> next committed batch): median {figures['recovery_median_s']} s,"
        f" max {figures['recovery_max_s']} s"
    )
    print(
        f"  driver cold start (launch -> first committed batch): median"
        f" {figures['cold_start_median_s']} s, max {figures['cold_start_max_s']} s"
    )
    if shared:
        figures["shared"] = shared
        print_shared(shared, figures)
    load_end = os.getloadavg()
    figures.update(
        rate_events_per_s=args.rate,
        trigger_seconds=1,
        load_average_start=[round(x, 2) for x in load_start],
        load_average_end=[round(x, 2) for x in load_end],
        machine=machine(),
    )
    print(
        f"load average at the start: {' '.join(f'{x:.2f}' for x in load_start)},"
        f" at the end: {' '.join(f'{x:.2f}' for x in load_end)}"
    )
    line = json.dumps(figures)
    print(line)
    out = Path(args.output)
    out.parent.mkdir(exist_ok=True)
    out.write_text(line + "\n")
    return 0


def shared_phase(
    args, app_name, name, topic, table, spec, loadgen, generators, sink_dsn, bootstrap,
    first_batch, next_run,
) -> dict:  # fmt: skip
    """The pipeline in a shared application: query failures restarted in the warm
    application, then kills of its JVM."""
    from kafka import KafkaProducer

    from controlplane.definitions import services
    from controlplane.definitions.models import (
        Failure,
        Pipeline,
        Run,
        RunState,
        SparkApplication,
    )

    app = SparkApplication.objects.create(
        name=app_name, driver_memory=args.shared_driver_memory, capacity=5, desired_state="running"
    )
    generators.append(loadgen(topic))
    services.create_pipeline(name=name, spec_data=spec(topic, table), desired_state="stopped")
    Pipeline.objects.filter(name=name).update(placement=app_name)
    Pipeline.objects.filter(name=name).update(desired_state="running")
    print(f"shared application {app_name}, pipeline {name} placed in it", flush=True)
    producer = KafkaProducer(bootstrap_servers=bootstrap)

    def send_bad() -> None:
        bad = {
            "delivery_id": "bench-rejected",
            "courier_id": "C0000",
            "status": "created",
            "lat": -1,
            "lon": 0,
            "event_time": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        producer.send(topic, json.dumps(bad).encode())
        producer.flush()

    warm_starts, fail_detections, fail_recoveries, from_injection = [], [], [], []
    refailures, same_process = 0, []
    kill_detections, kill_recoveries, relaunches = [], [], []
    try:
        run = wait(
            lambda: Run.objects.filter(pipeline__name=name, state=RunState.RUNNING).first(),
            240,
            "the first shared run",
        )
        for i in range(1, args.shared_failures + 1):
            wait(lambda r=run: first_batch(r), 180, "a committed batch")
            times = fail_query(run.run_dir, sink_dsn, table, "lat", send_bad)
            ended = wait(
                lambda r=run: (
                    Run.objects.filter(pk=r.pk, state=RunState.EXITED)
                    .values_list("ended_at", flat=True)
                    .first()
                ),
                120,
                "the failure to be recorded",
            )
            failed = run
            run = next_run(name, failed)
            recovered = first_batch(run).timestamp()
            # Launched into the warm application: its start, from the run's row to its batch.
            warm_starts.append(recovered - run.created_at.timestamp())
            fail_detections.append(ended.timestamp() - times["ended_at"])
            fail_recoveries.append(recovered - times["ended_at"])
            from_injection.append(recovered - times["injected_at"])
            refailures += run.generation - failed.generation - 1
            same_process.append(
                run.pid == failed.pid
                and run.application_generation == failed.application_generation
            )
            print(
                f"query failure {i}: recorded {fail_detections[-1]:.2f} s after the member's"
                f" exit, next batch committed {fail_recoveries[-1]:.2f} s after it"
                f" ({from_injection[-1]:.1f} s after the bad record was produced;"
                f" warm start of the failed run {warm_starts[-1]:.1f} s;"
                f" {'same process' if same_process[-1] else 'ANOTHER PROCESS'})",
                flush=True,
            )
        for i in range(1, args.shared_kills + 1):
            wait(lambda r=run: first_batch(r), 240, "a committed batch")
            app.refresh_from_db()
            killed_generation = app.generation
            pid = driver_pid(app.app_dir)
            killed_at = time.time()
            os.kill(pid, signal.SIGKILL)
            ended = wait(
                lambda r=run: (
                    Run.objects.filter(pk=r.pk, state=RunState.EXITED)
                    .values_list("ended_at", flat=True)
                    .first()
                ),
                120,
                "the application's loss to be recorded",
            )
            kill_detections.append(ended.timestamp() - killed_at)
            lost = run
            run = next_run(name, lost)
            kill_recoveries.append(first_batch(run).timestamp() - killed_at)
            app.refresh_from_db()
            if app.ready_at and app.generation > killed_generation:
                relaunches.append(app.ready_at.timestamp() - killed_at)
            print(
                f"JVM kill {i}: detected in {kill_detections[-1]:.2f} s, application up again"
                f" after {relaunches[-1] if relaunches else float('nan'):.1f} s, next batch"
                f" committed after {kill_recoveries[-1]:.1f} s (cause {lost_cause(lost)})",
                flush=True,
            )
    finally:
        producer.close()
    failures = Failure.objects.filter(pipeline__name=name)
    app.refresh_from_db()
    return {
        "application": {"driver_memory": app.driver_memory, "restarts": app.restarts},
        "query_failures": len(fail_recoveries),
        "query_failure_detection_median_s": median(fail_detections),
        "query_failure_recovery_median_s": median(fail_recoveries),
        "query_failure_recovery_max_s": round(max(fail_recoveries), 2) if fail_recoveries else None,
        "query_failure_from_injection_median_s": median(from_injection),
        "query_failure_refailures": refailures,
        "query_failure_same_process": all(same_process) if same_process else None,
        "jvm_kills": len(kill_recoveries),
        "jvm_kill_detection_median_s": median(kill_detections),
        "jvm_kill_recovery_median_s": median(kill_recoveries),
        "jvm_kill_recovery_max_s": round(max(kill_recoveries), 2) if kill_recoveries else None,
        "application_relaunch_median_s": median(relaunches),
        "member_warm_start_median_s": median(warm_starts),
        "member_warm_start_max_s": round(max(warm_starts), 2) if warm_starts else None,
        "failure_causes": sorted({f.cause for f in failures}),
    }


def lost_cause(run) -> str:
    run.refresh_from_db()
    return run.cause or "?"


def print_shared(shared: dict, figures: dict) -> None:
    def ratio(a, b):
        return round(a / b, 2) if a is not None and b else None

    shared["ratios"] = {
        "query_failure_recovery_to_dedicated_recovery": ratio(
            shared["query_failure_recovery_median_s"], figures["recovery_median_s"]
        ),
        "jvm_kill_recovery_to_dedicated_recovery": ratio(
            shared["jvm_kill_recovery_median_s"], figures["recovery_median_s"]
        ),
        "warm_start_to_dedicated_cold_start": ratio(
            shared["member_warm_start_median_s"], figures["cold_start_median_s"]
        ),
    }
    r = shared["ratios"]
    print(f"shared application (driver memory {shared['application']['driver_memory']}):")
    print(
        f"  query failure -> restart inside the warm application -> next committed batch:"
        f" median {shared['query_failure_recovery_median_s']} s, max"
        f" {shared['query_failure_recovery_max_s']} s over {shared['query_failures']}"
        f" (dedicated kill recovery {figures['recovery_median_s']} s:"
        f" x{r['query_failure_recovery_to_dedicated_recovery']});"
        f" recorded {shared['query_failure_detection_median_s']} s after the exit;"
        f" from the bad record's production {shared['query_failure_from_injection_median_s']} s;"
        f" failed again on the way: {shared['query_failure_refailures']}"
    )
    print(
        f"  JVM kill (application lost) -> next committed batch: median"
        f" {shared['jvm_kill_recovery_median_s']} s, max {shared['jvm_kill_recovery_max_s']} s"
        f" over {shared['jvm_kills']} (x{r['jvm_kill_recovery_to_dedicated_recovery']} of"
        f" dedicated); detected in {shared['jvm_kill_detection_median_s']} s; application up"
        f" again after {shared['application_relaunch_median_s']} s"
    )
    print(
        f"  member warm start (launch -> first committed batch): median"
        f" {shared['member_warm_start_median_s']} s, max {shared['member_warm_start_max_s']} s"
        f" (dedicated cold start {figures['cold_start_median_s']} s:"
        f" x{r['warm_start_to_dedicated_cold_start']})"
    )


def create_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cleanup_kafka_and_sink(
    bootstrap: str, topics: list[str], sink_dsn: str, tables: list[str], pipelines: list[str]
) -> None:
    """The bench's topics, sink tables and the sink's commit markers of its pipelines."""
    import psycopg
    from kafka.admin import KafkaAdminClient
    from psycopg import sql

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            existing = set(admin.list_topics())
            if gone := [t for t in topics if t in existing]:
                admin.delete_topics(gone)
        finally:
            admin.close()
    except Exception as exc:
        print(f"(could not delete the topics: {exc})", file=sys.stderr)
    try:
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            for table in tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
            if conn.execute("SELECT to_regclass('_cp_commits')").fetchone()[0]:
                conn.execute("DELETE FROM _cp_commits WHERE pipeline = ANY(%s)", (pipelines,))
    except Exception as exc:
        print(f"(could not drop the sink tables: {exc})", file=sys.stderr)


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return bool(consumer.partitions_for_topic(topic))
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
