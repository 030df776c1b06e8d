"""Recovery after kill -9: how fast a dead driver is noticed, and how fast data flows again.

    .venv/bin/python bench/recovery.py [--kills 10]     (after: eval "$(./stack services)")

Runs the control plane for real, on the dev stack's PostgreSQL, Redis and Kafka (in a database
of its own, dropped at the end): a web server (drivers' reports, the supervisor's exit
report), a Celery worker and beat (the reconcile tick), and a pipeline fed by the load
generator, with a fixed-delay policy of 0 s. Then, again
and again, it SIGKILLs the Spark driver (the JVM) once the run has committed a batch, and
measures from the kill:

  detection   until the control plane has recorded the run as ended
  recovery    until the next run's first batch with records is reported (committed)

next to the Spark driver's own cold start in the same run: from a run's launch to its first
batch with records. The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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


def start_control_plane(env: dict, workdir: Path) -> list[subprocess.Popen]:
    python = sys.executable
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "web": [python, "manage.py", "runserver", "--noreload", env["WEB_ADDRESS"]],
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rate", type=float, default=500.0, help="events per second produced")
    args = parser.parse_args()

    suffix = uuid.uuid4().hex[:6]
    workdir = ROOT / "var" / "bench-recovery" / suffix
    port = free_port()
    env = dict(os.environ)
    admin_url = env["DATABASE_URL"]
    database = f"controlplane_bench_{suffix}"
    create_database(admin_url, database)
    env.update(
        DATABASE_URL=admin_url.rsplit("/", 1)[0] + f"/{database}",
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
    from django.core.management import call_command
    from django.utils import timezone

    call_command("migrate", verbosity=0)

    from controlplane.connections.models import Connection
    from controlplane.definitions import services
    from controlplane.definitions.models import BatchProgress, Pipeline, Run, RunState
    from jobs.connections import validate_connection

    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    topic, name = f"recovery-{suffix}", f"bench-recovery-{suffix}"
    for conn_name, kind, settings in (
        (f"k-{suffix}", "kafka", {"bootstrap_servers": bootstrap}),
        (f"pg-{suffix}", "postgres", {"dsn": env["CONTROLPLANE_SINK_DATABASE_URL"]}),
    ):
        clean, secrets = validate_connection(kind, settings, {})
        connection = Connection(name=conn_name, kind=kind, settings=clean)
        connection.set_secrets(secrets)
        connection.save()
    loadgen = subprocess.Popen(
        [sys.executable, "-m", "jobs.loadgen", "--bootstrap", bootstrap, "--topic", topic,
         "--rate", str(args.rate), "--malformed", "0"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    wait(lambda: _topic_exists(bootstrap, topic), 30, "the topic", poll=0.5)
    spec = {
        "source": {
            "connection": f"k-{suffix}",
            "topics": [topic],
            "schema": "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE,"
            " lon DOUBLE, event_time TIMESTAMP",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": f"pg-{suffix}", "table": f"recovery_{suffix}"},
        "trigger": {"interval_seconds": 1},
        "restart_policy": {"kind": "fixed-delay", "attempts": 1000, "delay_seconds": 0},
    }
    services.create_pipeline(name=name, spec_data=spec, desired_state="running")
    processes = [loadgen, *start_control_plane(env, workdir)]
    print(f"control plane on port {port}, pipeline {name}, logs in {workdir}", flush=True)

    def first_batch(run: Run):
        row = (
            BatchProgress.objects.filter(run=run, num_input_rows__gt=0)
            .order_by("reported_at")
            .first()
        )
        return row.reported_at if row else None

    detections, recoveries, cold_starts = [], [], []
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
            pid = json.loads(Path(run.run_dir, "driver.json").read_text())["pid"]
            killed_at = timezone.now()
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
            detections.append((ended - killed_at).total_seconds())
            run = wait(
                lambda r=run: (
                    Run.objects.filter(pipeline__name=name, generation__gt=r.generation)
                    .order_by("generation")
                    .first()
                ),
                120,
                "the next run",
            )
            recovered = wait(lambda r=run: first_batch(r), 180, "the next committed batch")
            recoveries.append((recovered - killed_at).total_seconds())
            print(
                f"kill {kill}: detected in {detections[-1]:.2f} s, next batch committed after"
                f" {recoveries[-1]:.1f} s (cold start of the killed run {cold_starts[-1]:.1f} s)",
                flush=True,
            )
        # The last run's own cold start counts too.
        cold_starts.append((first_batch(run) - run.created_at).total_seconds())
    finally:
        Pipeline.objects.filter(name=name).update(desired_state="stopped")
        try:
            wait(
                lambda: (
                    not Run.objects.filter(
                        pipeline__name=name, state__in=RunState.active()
                    ).exists()
                ),
                120,
                "the pipeline to stop",
                poll=0.5,
            )
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)
            from django.db import connections

            connections.close_all()
            drop_database(admin_url, database)
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
    print(
        f"detection (kill -> control plane knows): median {figures['detection_median_s']} s,"
        f" max {figures['detection_max_s']} s"
    )
    print(
        f"recovery (kill -> next committed batch): median {figures['recovery_median_s']} s,"
        f" max {figures['recovery_max_s']} s"
    )
    print(
        f"driver cold start (launch -> first committed batch): median"
        f" {figures['cold_start_median_s']} s, max {figures['cold_start_max_s']} s"
    )
    print(json.dumps(figures))
    return 0


def create_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _topic_exists(bootstrap: str, topic: str) -> bool:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return bool(consumer.partitions_for_topic(topic))
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
