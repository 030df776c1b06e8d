"""Driving pipelines and their runs from a test (Django): creating, starting and reconciling
them, waiting on their runs, and counting what reached their sinks.

Two ways to drive the reconciler, both as the Celery tasks would:
- `step`/`until_it_ends` (pipeline `orders`, at a clock the test chooses) for stand-in drivers
  (tests/drivers/standin.py), which go through many runs in seconds;
- `reconcile_until` (one pipeline) and `tick_until` (the whole tick: shared applications, then
  pipelines) at the real time, for real spark-submit drivers and applications. Each tick costs:
  they poll every 0.5 s.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import psycopg
from django.utils import timezone

from controlplane.accounts.models import digest
from controlplane.definitions.models import Pipeline, Run, RunState, SparkApplication
from controlplane.supervision import reconciler
from tests.kafka_helpers import new_topic
from tests.waiting import wait_until

# How a run ends, as the first word of the reconciler's action ("crashed, start": it ended
# and a restart due at once was launched in the same step).
ENDED = {"crashed", "exited", "vanished", "lost-heartbeat", "launch-failed", "launch-lost"}

# The restart policy of the real-Spark members of shared applications.
POLICY = {"kind": "fixed-delay", "attempts": 10, "delay_seconds": 1}

# A reconcile tick of a real driver (or a whole tick) costs: polled this often.
TICK_EVERY = 0.5


# -- stand-in drivers: the pipeline `orders` at the test's clock ----------------------------


def orders() -> Pipeline:
    return Pipeline.objects.get(name="orders")


def step(now):
    return reconciler.reconcile_pipeline(orders().pk, now)


def until_it_ends(now) -> str:
    """Reconcile (at the test's time `now`) until the current run has ended; the action."""

    def ended() -> str | None:
        action = step(now)
        return action if action and action.split(", ")[0] in ENDED else None

    return wait_until(
        ended, 30, "the run to end", details=lambda: f"runs: {list(Run.objects.values())}"
    )


def start(api, policy) -> timezone.datetime:
    """`orders` with this restart policy, wanted running; a time just after now."""
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"restart_policy": policy}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    return timezone.now() + timedelta(seconds=1)


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


# -- real drivers and applications, at the real time -----------------------------------------


def new_pipeline(api, bootstrap: str, name: str, *, source=None, **spec) -> tuple[str, str]:
    """A pipeline `name` from a fresh topic into a fresh table; returns (topic, table)."""
    topic = new_topic(bootstrap)
    table = f"{name}_{topic.replace('-', '_')}"
    body = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
            **(source or {}),
        },
        "sink": {"connection": "warehouse", "table": table},
        "trigger": {"interval_seconds": 1},
        **spec,
    }
    response = api.post("/api/pipelines/", {"name": name, "spec": body}, format="json")
    assert response.status_code == 201, response.json()
    return topic, table


def reconcile_until(name, predicate, timeout, what):
    """Reconcile pipeline `name` until `predicate()` holds; its run and log tail if not."""

    def reconciled():
        reconciler.reconcile_pipeline(Pipeline.objects.get(name=name).pk, timezone.now())
        return predicate()

    def details() -> str:
        run = Run.objects.filter(pipeline__name=name).first()
        log = Path(run.log_path).read_text()[-3000:] if run and run.log_path else ""
        return f"run={run and run.__dict__}\n{log}"

    wait_until(reconciled, timeout, what, every=TICK_EVERY, details=details)


def tick_until(predicate, timeout: float, what: str) -> None:
    """The whole tick (shared applications, then pipelines) until `predicate()` holds; the
    application, the runs and the application's driver log if not."""

    def ticked():
        reconciler.tick(timezone.now())
        return predicate()

    def details() -> str:
        app = SparkApplication.objects.first()
        log = ""
        if app and app.app_dir and Path(app.app_dir, "driver.log").exists():
            log = Path(app.app_dir, "driver.log").read_text(errors="replace")[-6000:]
        runs = list(
            Run.objects.values("pipeline__name", "generation", "state", "cause", "error_tail")
        )
        return f"app={app and vars(app)}\n{runs}\n{log}"

    wait_until(ticked, timeout, what, every=TICK_EVERY, details=details)


def current(name: str) -> Run | None:
    """Pipeline `name`'s latest run."""
    return Run.objects.filter(pipeline__name=name).order_by("-generation").first()


def driver_pid(run: Run) -> int:
    """The pid of a run's Spark driver (the JVM), from its run directory."""
    return json.loads(Path(run.run_dir, "driver.json").read_text())["pid"]


def restarted_after_kill(name: str, run: Run, what: str) -> None:
    """Wait until a run other than `run` (whose driver was SIGKILLed) is running, and check
    that `run` ended as a crash by signal 9."""
    reconcile_until(
        name,
        lambda: (
            Run.objects.filter(pipeline__name=name, state=RunState.RUNNING)
            .exclude(pk=run.pk)
            .exists()
        ),
        120,
        what,
    )
    run.refresh_from_db()
    assert (run.cause, run.exit_code) == ("crashed", -9)


# -- what reached a Postgres sink ------------------------------------------------------------


def count(dsn, table):
    """(rows, distinct ids) in the sink table; (0, 0) before it exists."""
    with psycopg.connect(dsn) as conn:
        try:
            return conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"').fetchone()
        except psycopg.errors.UndefinedTable:
            return (0, 0)


def sink_rows(sink_dsn: str, table: str) -> dict[str, int]:
    """id -> n in the sink table; {} before it exists."""
    try:
        with psycopg.connect(sink_dsn) as conn:
            return dict(conn.execute(f'SELECT id, n FROM "{table}"').fetchall())
    except psycopg.errors.UndefinedTable:
        return {}


def with_current_run(row: Pipeline, **fields) -> Run:
    """`row` wanted and seen running, with a current run (generation 1) whose driver holds
    token 'tok-1'; `fields` set more of the run (started_at, last_heartbeat_at, ...)."""
    Pipeline.objects.filter(pk=row.pk).update(
        generation=1, desired_state="running", status="running"
    )
    return Run.objects.create(
        pipeline=row,
        generation=1,
        spec_version=1,
        state="running",
        token_digest=digest("tok-1"),
        **fields,
    )
