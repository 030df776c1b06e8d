"""start -> a real spark-submit driver writes to Postgres -> stop (graceful) -> start again.

Runs the reconciler directly (the Celery task is a thin wrapper around it); the driver is a
real detached spark-submit process, as in production.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
from django.utils import timezone
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient

from controlplane.definitions.models import BatchProgress, Pipeline, Run, RunState
from controlplane.observability.collector import collect
from controlplane.supervision import launcher, reconciler
from tests.isolation import assert_driver_isolated, plant_secrets
from tests.kafka_helpers import produce
from tests.runs import count, new_pipeline, reconcile_until
from tests.waiting import wait_for, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

# Both Kafka readers: Spark's connector (the default) and the Python reader.
READERS = ["spark-kafka", "python"]


def group_offsets(bootstrap: str, group: str) -> dict:
    """The group's committed offsets; {} while the broker's group coordinator is not ready
    (a new broker loads its offsets topic on first use: a retriable error, asked again)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        seen = admin.list_group_offsets(group)[group]
    except kafka_errors.KafkaError as exc:
        if not getattr(exc, "retriable", False):
            raise
        return {}
    finally:
        admin.close()
    return {(tp.topic, tp.partition): m.offset for tp, m in seen.items()}


def test_start_runs_a_driver_and_stop_ends_it_gracefully_and_it_resumes(
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    job_dirs,
    monkeypatch,
    settings,
):
    # The worker's secrets, which the driver must not inherit (checked below).
    plant_secrets(monkeypatch)
    # Spark's UI as in production (tests' other drivers start without it): where it listens
    # is checked below.
    settings.CONTROLPLANE_SPARK_UI_ENABLED = True
    # Kafka keeps a group's offsets (on disk, across runs): a group of this run's own.
    group = f"e2e-lag-tools-{uuid.uuid4().hex[:8]}"
    topic, table = new_pipeline(api, kafka_bootstrap, "e2e", source={"consumer_group": group})
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(500)))

    response = api.post("/api/pipelines/e2e/start/")
    assert response.status_code == 202
    assert response.json()["desired_state"] == "running"
    reconcile_until("e2e", lambda: count(sink_dsn, table)[0] == 500, 150, "the first 500 rows")
    run = Run.objects.get(pipeline__name="e2e")
    assert (run.state, run.generation) == ("running", 1)
    assert Pipeline.objects.get(name="e2e").status == "running"
    # Its JVM and Python program hold none of them; its Spark UI listens on loopback only.
    assert_driver_isolated(run)
    # The driver reported its batches and heartbeats with its run token.
    reconcile_until("e2e", lambda: run.batches.exists(), 30, "the first progress report")
    assert sum(run.batches.values_list("num_input_rows", flat=True)) == 500
    points = api.get("/api/pipelines/e2e/metrics/history/").json()["points"]
    assert sum(p["input_rows"] for p in points) == 500
    collect(timezone.now())  # the metrics collector's round (a beat task in production)
    figures = api.get("/api/pipelines/e2e/metrics/").json()
    assert (figures["lag"]["records"], figures["lag"]["status"]) == (0, "ok")
    assert figures["checkpoint"]["source"] == "checkpoint"
    assert figures["checkpoint"]["last_batch_id"] == max(p["batch_id"] for p in points)
    assert figures["throughput"]["processed_rows_per_second"] > 0
    run.refresh_from_db()
    assert run.last_heartbeat_at is not None
    # The spec's consumer group holds what the checkpoint committed: lag tools see the job.
    committed = {
        (t, int(p)): o
        for t, parts in figures["checkpoint"]["committed_offsets"].items()
        for p, o in parts.items()
    }
    assert sum(committed.values()) == 500
    seen = {}

    def mirrored():
        seen.update(group=group_offsets(kafka_bootstrap, group))
        return seen["group"] == committed

    assert wait_for(mirrored, 20), (seen, committed)

    assert api.post("/api/pipelines/e2e/stop/").status_code == 202
    reconcile_until(
        "e2e", lambda: Pipeline.objects.get(name="e2e").status == "stopped", 120, "the stop"
    )
    run.refresh_from_db()
    assert (run.state, run.cause, run.exit_code) == ("exited", "stopped", 0)

    produce(kafka_bootstrap, topic, ({"id": f"b{i}", "n": i} for i in range(300)), start=500)
    api.post("/api/pipelines/e2e/start/")
    reconcile_until("e2e", lambda: count(sink_dsn, table)[0] >= 800, 150, "the next 300 rows")
    assert count(sink_dsn, table) == (800, 800)  # resumed from the checkpoint: no duplicates
    assert Run.objects.filter(pipeline__name="e2e").count() == 2
    api.post("/api/pipelines/e2e/stop/")
    reconcile_until(
        "e2e", lambda: Pipeline.objects.get(name="e2e").status == "stopped", 120, "the 2nd stop"
    )


@pytest.mark.parametrize("reader", READERS)
def test_a_driver_killed_while_its_batch_transaction_is_open_loses_and_duplicates_nothing(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, job_dirs, reader
):
    """SIGKILL the whole driver while its executors are inside their batch's transactions
    (held there by a lock on the target table), then start again: every record exactly once."""
    topic, table = new_pipeline(api, kafka_bootstrap, "killed", source={"reader": reader})
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(300)))
    api.post("/api/pipelines/killed/start/")
    reconcile_until("killed", lambda: count(sink_dsn, table)[0] == 300, 150, "the first rows")
    run = Run.objects.get(pipeline__name="killed")

    with psycopg.connect(sink_dsn) as lock, psycopg.connect(sink_dsn, autocommit=True) as look:
        lock.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        produce(kafka_bootstrap, topic, ({"id": f"b{i}", "n": i} for i in range(400)), start=300)

        def writers_blocked_in_their_transaction():
            (waiting,) = look.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cp:killed'"
                " AND wait_event_type = 'Lock' AND xact_start IS NOT NULL"
            ).fetchone()
            return waiting > 0

        reconcile_until("killed", writers_blocked_in_their_transaction, 90, "a blocked batch")
        launcher.kill(run)
        reconcile_until("killed", lambda: launcher.alive(run) is False, 30, "the kill")
        lock.rollback()  # the lock goes; the dead driver's transactions must not commit
    reconcile_until(
        "killed",
        lambda: Run.objects.get(pk=run.pk).state == RunState.EXITED,
        30,
        "the dead run to be noticed",
    )
    assert count(sink_dsn, table) == (300, 300)

    api.post("/api/pipelines/killed/start/")
    reconcile_until("killed", lambda: count(sink_dsn, table)[0] >= 700, 150, "the rest")
    assert count(sink_dsn, table) == (700, 700)
    api.post("/api/pipelines/killed/stop/")
    reconcile_until(
        "killed", lambda: Pipeline.objects.get(name="killed").status == "stopped", 120, "stop"
    )


def test_an_idle_query_is_left_alone_and_a_stuck_one_is_restarted(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, job_dirs, settings
):
    """Spark's idle events keep a query with nothing to read from counting as stalled; a
    batch that hangs (its sink table locked) is: killed, restarted, nothing lost."""
    settings.CONTROLPLANE_STALL_SECONDS = 10
    topic, table = new_pipeline(
        api,
        kafka_bootstrap,
        "stuck",
        restart_policy={"kind": "fixed-delay", "attempts": 3, "delay_seconds": 1},
    )
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(100)))
    api.post("/api/pipelines/stuck/start/")
    reconcile_until("stuck", lambda: count(sink_dsn, table)[0] == 100, 150, "the first rows")
    run = Run.objects.get(pipeline__name="stuck", state=RunState.RUNNING)

    idle_until = time.monotonic() + 16  # longer than the 10 s window
    while time.monotonic() < idle_until:
        reconciler.reconcile_pipeline(run.pipeline_id, timezone.now())
        time.sleep(1)
    run.refresh_from_db()
    assert run.state == RunState.RUNNING, run.error_tail
    assert run.last_idle_at is not None

    with psycopg.connect(sink_dsn) as lock:
        lock.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        produce(kafka_bootstrap, topic, ({"id": f"b{i}", "n": i} for i in range(100)), start=100)
        reconcile_until(
            "stuck",
            lambda: Run.objects.get(pk=run.pk).cause == "stalled",
            90,
            "the stuck batch to count as stalled",
        )
        lock.rollback()
    reconcile_until("stuck", lambda: count(sink_dsn, table)[0] >= 200, 150, "the restart")
    assert count(sink_dsn, table) == (200, 200)
    assert Pipeline.objects.get(name="stuck").failures.get().cause == "stalled"
    api.post("/api/pipelines/stuck/stop/")
    reconcile_until(
        "stuck", lambda: Pipeline.objects.get(name="stuck").status == "stopped", 120, "stop"
    )


def test_a_fast_sink_shows_ok_and_a_slow_one_high_backpressure_and_growing_lag(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, job_dirs
):
    """Records keep arriving. First the sink keeps up easily; then every COPY into the
    target is made to wait 12 s (a trigger on the table), longer than the trigger interval,
    so the job reads fewer records than arrive."""
    topic, table = new_pipeline(
        api,
        kafka_bootstrap,
        "slow",
        source={"max_records_per_batch": 1000},
        trigger={"interval_seconds": 5},
    )
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{table}" (id text, n integer)')
        conn.execute(
            "CREATE OR REPLACE FUNCTION cp_test_slow() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN PERFORM pg_sleep(12); RETURN NULL; END $$"
        )

    api.post("/api/pipelines/slow/start/")
    produced = 0

    def feed_until(predicate, timeout, what):
        figures = {}

        def fed():
            nonlocal produced
            produce(
                kafka_bootstrap,
                topic,
                ({"id": f"r{i}", "n": i} for i in range(produced, produced + 100)),
                start=produced,
            )
            produced += 100
            reconciler.reconcile_pipeline(Pipeline.objects.get(name="slow").pk, timezone.now())
            collect(timezone.now())
            figures.clear()
            figures.update(api.get("/api/pipelines/slow/metrics/").json())
            return predicate(figures) and dict(figures)

        # Every 1 s, not faster: each poll also produces 100 records, so the interval sets
        # the arrival rate the sink keeps up with (or, slowed down, does not).
        return wait_until(fed, timeout, what, every=1, details=lambda: figures)

    def steady_batches():
        return BatchProgress.objects.filter(run__pipeline__name="slow", num_input_rows__gt=0)

    # Keeping up, the lag is a saw-tooth (records arrive between batches): the status is
    # ok, though one round may catch a tooth rising over the window (the lag's trend is a
    # regression over the collector's samples, not over the commits), so it is waited for.
    fast = feed_until(
        lambda f: steady_batches().count() >= 4 and f["lag"]["status"] == "ok",
        150,
        "four batches, lag ok",
    )
    assert fast["backpressure"]["level"] == "ok", fast["backpressure"]
    assert fast["backpressure"]["busy_ratio"] < 0.5

    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TRIGGER slow AFTER INSERT ON "{table}"'
            " FOR EACH STATEMENT EXECUTE FUNCTION cp_test_slow()"
        )
    slow = feed_until(
        lambda f: f["lag"]["status"] == "lagging" and f["backpressure"]["level"] == "high",
        300,
        "high backpressure and growing lag",
    )
    assert slow["backpressure"]["busy_ratio"] > 1.0
    assert slow["lag"]["records"] > 0 and slow["lag"]["trend"] > 0
    api.post("/api/pipelines/slow/kill/")
