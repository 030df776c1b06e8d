"""Pipelines run in the test's own Spark session (jobs.pipeline.start_query), without a
control plane: their run configuration, running them, reading what they wrote, and their
checkpoints."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from jobs.pipeline import start_query
from jobs.runconfig import RunConfig
from jobs.spec import parse_spec


def run_config(
    tmp_path,
    topic,
    sink_dsn,
    *,
    mode="append",
    key=(),
    transform=None,
    reader=None,
    consumer_group=None,
    bootstrap=None,
):
    """Kafka `topic` (records as `events` makes them) into a fresh Postgres table. Without
    `bootstrap`, the broker a module's autouse fixture put in `pytest.kafka_bootstrap`."""
    name = f"p-{uuid.uuid4().hex[:8]}"
    table = f"t_{uuid.uuid4().hex[:8]}"
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": "id STRING, amount DOUBLE, ts TIMESTAMP",
            "starting_offsets": "earliest",
            "max_records_per_batch": 400,
            "reader": reader,
            "consumer_group": consumer_group,
        },
        "sink": {"connection": "pg", "table": table, "mode": mode, "key": list(key)},
        "transform": transform,
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=name,
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap or pytest.kafka_bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(run_dir),
    )


def events(start, stop):
    return [
        {"id": f"e{i}", "amount": i * 1.5, "ts": "2026-11-21T10:00:00Z"} for i in range(start, stop)
    ]


def drain(spark, config):
    """Run the query until the topic is drained; the query (its progress) afterwards."""
    query = start_query(spark, config, available_now=True)
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    return query


def failure(spark, config) -> str:
    """What the query's run fails with (it must fail)."""
    query = start_query(spark, config, available_now=True)
    with pytest.raises(Exception) as failed:
        query.awaitTermination(120)
    return str(failed.value)


def fetch(dsn, query, *args):
    with psycopg.connect(dsn) as conn:
        return conn.execute(query, args).fetchall()


def forget_last_commit(checkpoint) -> None:
    """As if the driver died right after the sink's transactions, before Spark's commit log
    entry: the last batch is replayed at the next start."""
    commits = list((Path(checkpoint) / "commits").glob("[0-9]*"))
    assert commits, "the query wrote no commit log"
    last = max(commits, key=lambda p: int(p.name))
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)


def fake_checkpoint(root: Path, *, committed: int, in_flight: bool = True) -> Path:
    """A checkpoint whose batches 0..committed are committed (and one more planned), with a
    state store of one partition (version V after batch V - 1)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": "11111111-old"}) + "\n")
    (root / ".metadata.crc").write_bytes(b"crc")
    for log in ("offsets", "commits", "sources/0", "state/0/0"):
        (root / log).mkdir(parents=True, exist_ok=True)
    (root / "sources" / "0" / "0").write_text('v1\n{"orders":{"0":0}}\n')
    last = committed + 1 if in_flight else committed
    for n in range(last + 1):
        offsets = {"orders": {"0": (n + 1) * 10, "1": (n + 1) * 5}}
        (root / "offsets" / str(n)).write_text(f"v1\n{{}}\n{json.dumps(offsets)}\n")
        (root / "offsets" / f".{n}.crc").write_bytes(b"crc")
        (root / "state" / "0" / "0" / f"{n + 1}.delta").write_bytes(b"rows")
        (root / "state" / "0" / "0" / f".{n + 1}.delta.crc").write_bytes(b"crc")
        if n <= committed:
            (root / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
            (root / "commits" / f".{n}.crc").write_bytes(b"crc")
    (root / "offsets" / f".{last + 1}.4f2a.tmp").write_text("half written")
    return root
