"""A cassandra sink through a Cassandra outage: the node (one of the test's own, on its own
ports: the shared one must not stop under other tests) is stopped for 30 s while the query
drains a backlog, then started again. The batch in flight waits (its writes are retried while
no replica answers, up to the writer's 60 s) and the query goes on; the table ends exactly as
a run without the outage writes it (every key's value and write time)."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic
from tests.outage_stack import free_port
from tests.spark_helpers import drain
from tests.test_cassandra_kills import KEYS, produce_updates

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parent.parent
OUTAGE_SECONDS = 30
RECORDS = 12_000  # 24 batches of 500: the outage falls inside, after the first


def _devstack():
    spec = importlib.util.spec_from_file_location(
        "cassandra_outage_devstack", ROOT / "scripts" / "devstack.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def node():
    var = Path(tempfile.mkdtemp(prefix="cp-cassandra-outage-", dir="/tmp"))
    own = _devstack().Cassandra(var=var, port=free_port(), storage_port=free_port())
    try:
        own.start()
        cluster = own.cluster()
        try:
            session = cluster.connect()
            session.execute(
                "CREATE KEYSPACE IF NOT EXISTS outage WITH replication ="
                " {'class': 'SimpleStrategy', 'replication_factor': 1}"
            )
        finally:
            cluster.shutdown()
        yield own
    finally:
        own.stop()
        shutil.rmtree(var, ignore_errors=True)


def config(tmp_path, node, topic, bootstrap, sink_dsn, table: str) -> RunConfig:
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": "id STRING, n INT, at TIMESTAMP",
            "starting_offsets": "earliest",
            "max_records_per_batch": 500,
            "min_partitions": 3,
        },
        "sink": {
            "kind": "cassandra",
            "connection": "c",
            "table": table,
            "partition_key": ["id"],
            "consistency": "ONE",
            "dead_letters": {"connection": "pg"},
        },
    }
    return RunConfig(
        pipeline=f"outage-{table}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / table / "checkpoint"),
        run_dir=str(tmp_path),
        sink_configs=(
            {
                "cassandra": {
                    "contact_points": [node.hosts],
                    "local_datacenter": "datacenter1",
                    "keyspace": "outage",
                    "username": "cassandra",
                    "password": "cassandra",
                    "tls": None,
                },
                "postgres": {"conninfo": sink_dsn},
            },
        ),
    )


def table_state(node, table: str) -> dict[str, tuple[int, int]]:
    cluster = node.cluster()
    try:
        session = cluster.connect("outage")
        found = session.execute(f"SELECT id, n, writetime(n) AS stamp FROM {table}")
        return {r.id: (r.n, r.stamp) for r in found}
    finally:
        cluster.shutdown()


def test_an_outage_of_30_s_under_load_ends_as_a_run_without_it(
    spark, node, kafka_bootstrap, sink_dsn, tmp_path
):
    topic = new_topic(kafka_bootstrap)
    produce_updates(kafka_bootstrap, topic, RECORDS)
    suffix = uuid.uuid4().hex[:8]
    through, without = f"through_{suffix}", f"without_{suffix}"
    outage: dict[str, float] = {}

    def stop_for_a_while() -> None:
        # Once the query has written its first batch (the table is made by it).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if table_state(node, through):
                    break
            time.sleep(0.5)
        outage["stopped"] = time.monotonic()
        node.stop()
        time.sleep(OUTAGE_SECONDS)
        node.start()
        outage["started"] = time.monotonic()

    cutter = threading.Thread(target=stop_for_a_while, daemon=True)
    cutter.start()
    query = drain(spark, config(tmp_path, node, topic, kafka_bootstrap, sink_dsn, through))
    ended = time.monotonic()
    cutter.join(180)
    assert "started" in outage, "the node was never stopped and started again"
    # The outage fell inside the run: stopped before the query ended, which it did only after
    # the node was back (a batch waited through it).
    assert outage["stopped"] < ended and outage["started"] < ended, (outage, ended)
    assert query.exception() is None
    drain(spark, config(tmp_path, node, topic, kafka_bootstrap, sink_dsn, without))
    assert table_state(node, through) == table_state(node, without)
    assert len(table_state(node, without)) == KEYS
    assert {k: n for k, (n, _) in table_state(node, through).items()} == {
        f"k{key}": key + KEYS * ((RECORDS - 1 - key) // KEYS) for key in range(KEYS)
    }
