"""A pipeline on a Spark standalone cluster: a master and two workers on loopback, started by
the same code as `./stack cluster` (scripts/devstack.py's SparkCluster), the driver launched by
the reconciler with SPARK_MASTER pointing at it.

An executor JVM killed while its tasks are inside their batch's Postgres transactions: Spark
runs the tasks again on another executor, the same run keeps committing, every record lands
once. A worker daemon killed under a shared application (its member's query running): the
master drops it, the member goes on with the other worker, and the worker started again
registers and gets an executor of the application again.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import sys
import threading
from pathlib import Path

import psutil
import psycopg
import pytest

from controlplane.definitions.models import Pipeline, Run, RunState, SparkApplication
from controlplane.supervision import launcher
from tests.kafka_helpers import produce
from tests.outage_stack import free_port
from tests.runs import count, new_pipeline, reconcile_until, tick_until

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = importlib.util.spec_from_file_location(
        "devstack_cluster", ROOT / "scripts" / "devstack.py"
    )
    devstack = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = devstack  # dataclasses look their module up there
    spec.loader.exec_module(devstack)
    started = devstack.SparkCluster(
        2,
        var=tmp_path_factory.mktemp("spark-cluster"),
        port=free_port(),
        ui_port=free_port(),
        cores=2,
        memory="1g",
    )
    started.start()
    yield started
    started.stop()


@pytest.fixture
def on_cluster(settings, cluster, job_dirs):
    settings.SPARK_MASTER = cluster.url
    return cluster


def executors(cluster) -> dict[int, str]:
    """Executor JVMs of the cluster's workers: pid -> the worker that launched it."""
    found = {}
    for n in range(1, cluster.workers + 1):
        pid = cluster.pid(f"worker-{n}")
        if pid is None:
            continue
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                    found[child.pid] = f"worker-{n}"
            except psutil.NoSuchProcess:
                continue
    return found


class Load:
    """Records sent in the background, 100 every 0.2 s, ids 0, 1, 2, ..."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.sent = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.2):
            values = ({"id": f"r{i}", "n": i} for i in range(self.sent, self.sent + 100))
            self.sent += produce(self.bootstrap, self.topic, values, start=self.sent)

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.done.set()
        self.thread.join(30)


def start(api, kafka_bootstrap, name) -> tuple[str, str]:
    topic, table = new_pipeline(api, kafka_bootstrap, name)
    assert api.post(f"/api/pipelines/{name}/start/").status_code == 202
    return topic, table


def test_an_executor_killed_inside_its_batch_transaction_is_retried_exactly_once(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, on_cluster
):
    topic, table = start(api, kafka_bootstrap, "clustered")
    with Load(kafka_bootstrap, topic) as load:
        reconcile_until("clustered", lambda: count(sink_dsn, table)[0] >= 300, 180, "rows")
        run = Run.objects.get(pipeline__name="clustered")
        assert sorted(executors(on_cluster).values()) == ["worker-1", "worker-2"]

        with psycopg.connect(sink_dsn) as lock, psycopg.connect(sink_dsn, autocommit=True) as look:
            lock.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
            blocked: list[int] = []

            def writers_blocked_in_their_transaction():
                blocked[:] = [
                    port
                    for (port,) in look.execute(
                        "SELECT client_port FROM pg_stat_activity"
                        " WHERE application_name = 'cp:clustered' AND wait_event_type = 'Lock'"
                        " AND xact_start IS NOT NULL"
                    ).fetchall()
                ]
                return bool(blocked)

            reconcile_until("clustered", writers_blocked_in_their_transaction, 90, "a batch")
            # The executor whose task holds one of those connections.
            holder = next(
                pid
                for pid in executors(on_cluster)
                for c in psutil.Process(pid).net_connections("tcp")
                if c.laddr and c.laddr.port in blocked
            )
            os.kill(holder, signal.SIGKILL)
            lock.rollback()  # its transaction died with it; the retried tasks write instead

        before = count(sink_dsn, table)[0]
        reconcile_until(
            "clustered", lambda: count(sink_dsn, table)[0] >= before + 1_000, 180, "more rows"
        )
        # The worker launched a new executor for the application in place of the killed one.
        reconcile_until(
            "clustered",
            lambda: len(executors(on_cluster)) == 2 and holder not in executors(on_cluster),
            60,
            "a new executor in place of the killed one",
        )
    reconcile_until("clustered", lambda: count(sink_dsn, table)[0] >= load.sent, 120, "the rest")
    assert count(sink_dsn, table) == (load.sent, load.sent)  # every record once
    run.refresh_from_db()
    assert (run.state, run.generation) == (RunState.RUNNING, 1)  # Spark retried: no restart
    assert not run.pipeline.failures.exists()
    # The driver saw the executor go with tasks of a batch, and Spark ran them again.
    log = Path(run.log_path).read_text()
    assert "Lost executor" in log
    assert re.search(r"Lost task \S+ in stage .*ExecutorLostFailure", log)
    stop(api, "clustered")


def test_a_worker_daemon_killed_leaves_a_shared_application_s_member_running_and_rejoins(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, on_cluster
):
    """The pipeline is a member of a shared application whose executors are on the
    cluster (the application's own `master`); its reports go through the application's
    one channel."""
    app = SparkApplication.objects.create(
        name="on-cluster", master=on_cluster.url, capacity=2, driver_memory="1g"
    )
    topic, table = new_pipeline(api, kafka_bootstrap, "rejoined")
    Pipeline.objects.filter(name="rejoined").update(placement="on-cluster")
    assert api.post("/api/pipelines/rejoined/start/").status_code == 202
    try:
        with Load(kafka_bootstrap, topic) as load:
            tick_until(lambda: count(sink_dsn, table)[0] >= 300, 180, "rows")
            run = Run.objects.get(pipeline__name="rejoined")
            app.refresh_from_db()
            assert (run.application_id, run.pid) == (app.pk, app.pid)
            assert sorted(executors(on_cluster).values()) == ["worker-1", "worker-2"]
            worker = on_cluster.pid("worker-1")
            os.kill(worker, signal.SIGKILL)
            tick_until(lambda: on_cluster.alive_workers() == 1, 60, "the master to drop it")
            before = count(sink_dsn, table)[0]
            tick_until(lambda: count(sink_dsn, table)[0] >= before + 500, 120, "more rows")
            assert set(executors(on_cluster).values()) == {"worker-2"}

            on_cluster.start()  # starts what is not running: worker-1
            assert on_cluster.alive_workers() == 2
            tick_until(
                lambda: sorted(executors(on_cluster).values()) == ["worker-1", "worker-2"],
                90,
                "an executor on the worker that came back",
            )
            before = count(sink_dsn, table)[0]
            tick_until(lambda: count(sink_dsn, table)[0] >= before + 500, 120, "more rows")
        tick_until(lambda: count(sink_dsn, table)[0] >= load.sent, 120, "the rest")
        assert count(sink_dsn, table) == (load.sent, load.sent)
        run.refresh_from_db()
        assert (run.state, run.generation) == (RunState.RUNNING, 1)
        # Heard all along through the application's channel: its batches are known.
        # (Every batch, before and after the worker's loss: ids from 0 without a gap; how many
        # there were depends on how fast the machine drained the load.)
        assert run.last_batch_id is not None and run.last_batch_id >= 3
        assert set(run.batches.values_list("batch_id", flat=True)) == set(
            range(run.last_batch_id + 1)
        )
        api.post("/api/pipelines/rejoined/stop/")
        tick_until(
            lambda: Pipeline.objects.get(name="rejoined").status == "stopped", 120, "the stop"
        )
    finally:
        app.refresh_from_db()
        if app.pid:
            launcher.kill_application(app)


def stop(api, name: str) -> None:
    api.post(f"/api/pipelines/{name}/stop/")
    reconcile_until(
        name, lambda: Pipeline.objects.get(name=name).status == "stopped", 120, "the stop"
    )
