"""Many pipelines in one shared Spark application, with real Spark, Kafka and Postgres.

- Three pipelines share one application. One's query fails (its sink rejects a row): it is
  restarted inside the warm application (the same process), within its restart policy, while
  the other two keep their runs and keep committing. Then the application's driver JVM is
  kill -9'd: every member's run ends as `application-lost`, the application is started
  again, and all three come back. Every record is in its sink exactly once.
- A query that does not stop when killed (its sink table is locked, so its batch hangs) gets
  its application recycled: the other member is stopped gracefully and comes back, the stuck
  one restarts per its policy, and nothing is lost or written twice.

The reconciler is driven directly (the Celery task is a thin wrapper around it); drivers and
applications are real detached processes that report to the test's live server.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import psycopg
import pytest

from controlplane.definitions.models import Failure, Pipeline, Run, SparkApplication
from controlplane.supervision import applications
from jobs.kafka import readers
from tests.kafka_helpers import produce
from tests.runs import POLICY, count, current, new_pipeline, tick_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def member_pipelines(api, kafka_bootstrap, names, rows, specs=None) -> dict[str, tuple[str, str]]:
    made = {}
    for name in names:
        spec = (specs or {}).get(name, {})
        topic, table = new_pipeline(api, kafka_bootstrap, name, restart_policy=POLICY, **spec)
        Pipeline.objects.filter(name=name).update(placement="shared")
        produce(kafka_bootstrap, topic, ({"id": f"{name}{i}", "n": i} for i in range(rows)))
        made[name] = (topic, table)
        assert api.post(f"/api/pipelines/{name}/start/").status_code == 202
    return made


def exactly(sink_dsn, table, n) -> bool:
    return count(sink_dsn, table) == (n, n)


def driver_jvm(app: SparkApplication) -> psutil.Process:
    supervisor = psutil.Process(app.pid)
    return next(
        p for p in supervisor.children(recursive=True) if p.name() == "java" or "java" in p.exe()
    )


def test_three_pipelines_in_one_application_fail_alone_and_come_back_after_its_loss(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, shared
):
    names = ["alpha", "beta", "gamma"]
    made = member_pipelines(api, kafka_bootstrap, names, 300)
    tick_until(
        lambda: all(exactly(sink_dsn, made[n][1], 300) for n in names), 240, "the first rows"
    )
    app = SparkApplication.objects.get(name="shared")
    assert app.status == "running" and app.generation == 1
    first = {n: current(n) for n in names}
    # One process hosts the three queries: the runs name the application's supervisor.
    assert {r.application_id for r in first.values()} == {app.pk}
    assert {r.pid for r in first.values()} == {app.pid}
    assert applications.with_members().get(pk=app.pk).member_count == 3
    # A member's batches are not split over the application's task slots (8 in local mode):
    # one input partition at least, i.e. the topic's own (RunConfig.default_partitions).
    for run in first.values():
        checkpoint = json.loads((Path(run.run_dir) / "run.json").read_text())["checkpoint"]
        assert readers.read_pin(checkpoint).min_partitions == 1

    # beta's sink rejects a row: its batch fails, so its query does; the table accepts it
    # again once the failure is recorded.
    beta_topic, beta_table = made["beta"]
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{beta_table}" ADD CONSTRAINT reject CHECK (n <> -1)')
    produce(kafka_bootstrap, beta_topic, [{"id": "beta-bad", "n": -1}], start=300)
    tick_until(
        lambda: Failure.objects.filter(pipeline__name="beta").exists(), 120, "beta's failure"
    )
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{beta_table}" DROP CONSTRAINT reject')
    for name in ("alpha", "gamma"):
        topic, _ = made[name]
        produce(kafka_bootstrap, topic, ({"id": f"{name}{i}", "n": i} for i in range(300, 400)))
    tick_until(lambda: exactly(sink_dsn, beta_table, 301), 120, "beta back, with the rejected row")
    tick_until(
        lambda: all(exactly(sink_dsn, made[n][1], 400) for n in ("alpha", "gamma")),
        60,
        "alpha and gamma's new rows",
    )
    failure = Failure.objects.get(pipeline__name="beta")
    assert failure.cause == "crashed" and "reject" in failure.message
    beta = current("beta")
    assert beta.generation > 1 and beta.state == "running"
    # Restarted inside the warm application: the same process, no new JVM.
    assert beta.pid == app.pid and beta.application_generation == app.generation
    # The others were never touched: still their first run.
    assert [current(n).pk for n in ("alpha", "gamma")] == [first["alpha"].pk, first["gamma"].pk]
    assert not Failure.objects.filter(pipeline__name__in=["alpha", "gamma"]).exists()

    # The application's driver JVM is kill -9'd: every member is lost with it.
    driver_jvm(app).send_signal(signal.SIGKILL)
    tick_until(
        lambda: Failure.objects.filter(cause="application-lost").count() == 3,
        60,
        "three application-lost failures",
    )
    # Said in words, with the catalogue's category (and its fix).
    for lost in Failure.objects.filter(cause="application-lost"):
        assert lost.category == "application-lost", lost.__dict__
        assert lost.reason.startswith("its shared application's process ended"), lost.reason
    for name in names:
        topic, _ = made[name]
        produce(kafka_bootstrap, topic, ({"id": f"{name}{i}", "n": i} for i in range(400, 450)))
    expected = {"alpha": 450, "beta": 351, "gamma": 450}
    tick_until(
        lambda: all(exactly(sink_dsn, made[n][1], expected[n]) for n in names),
        240,
        "all three back after the loss",
    )
    app.refresh_from_db()
    assert (app.generation, app.restarts, app.status) == (2, 1, "running")
    assert app.last_exit_code is not None
    assert {current(n).application_generation for n in names} == {2}
    assert {current(n).state for n in names} == {"running"}


def test_a_query_that_does_not_stop_gets_its_application_recycled(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, shared, settings
):
    settings.CONTROLPLANE_STALL_SECONDS = 15
    settings.CONTROLPLANE_KILL_TIMEOUT = 5
    names = ["stuck", "bystander"]
    # Its transform shuffles: the batch is staged, then committed into the table by the
    # Python driver's connection, where a lock holds it; Spark cannot interrupt that.
    grouped = {"transform": {"sql": "SELECT id, max(n) AS n FROM source GROUP BY id"}}
    made = member_pipelines(api, kafka_bootstrap, names, 200, {"stuck": grouped})
    tick_until(
        lambda: all(exactly(sink_dsn, made[n][1], 200) for n in names), 240, "the first rows"
    )
    app = SparkApplication.objects.get(name="shared")
    bystander = current("bystander")

    # The stuck pipeline's table is locked: its next batch hangs in the sink, and so does a
    # kill of its query (Spark gives up waiting for it after spark.sql.streaming.stopTimeout).
    topic, table = made["stuck"]
    holder = psycopg.connect(sink_dsn)
    try:
        holder.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        produce(kafka_bootstrap, topic, ({"id": f"stuck{i}", "n": i} for i in range(200, 300)))
        tick_until(lambda: current("stuck").kill_requested_at is not None, 90, "the stall's kill")
        tick_until(
            lambda: SparkApplication.objects.get(pk=app.pk).generation == 2,
            120,
            "the application recycled",
        )
    finally:
        holder.rollback()
        holder.close()
    more = ({"id": f"bystander{i}", "n": i} for i in range(200, 260))
    produce(kafka_bootstrap, made["bystander"][0], more)
    tick_until(
        lambda: exactly(sink_dsn, table, 300) and exactly(sink_dsn, made["bystander"][1], 260),
        240,
        "both back after the recycle",
    )
    bystander.refresh_from_db()
    assert (bystander.state, bystander.cause) == ("exited", "recycled")
    assert not Failure.objects.filter(pipeline__name="bystander").exists()
    stuck_run = Run.objects.get(pipeline__name="stuck", generation=1)
    assert stuck_run.cause == "stalled"
    assert Failure.objects.get(pipeline__name="stuck").cause == "stalled"
    app.refresh_from_db()
    # A recycle is no loss: not counted as a restart; why it happened is kept.
    assert app.restarts == 0 and "did not stop" in app.recycle_reason
    assert {current(n).application_generation for n in names} == {2}
