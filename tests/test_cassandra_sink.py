"""Kafka -> Cassandra through the cassandra sink, in the test's own Spark session (the real
query, jobs.pipeline.start_query), into the real Cassandra node `./stack test` starts: rows
land with the output's values and types, each cell stamped with its record's own position in
the source (between its batch's and the one before's); a replayed batch changes nothing; an
older write that comes late (a zombie task) never wins over a newer one, nor does an older
event when the spec stamps by event time; a stateful count in update mode lands as upserts;
dead letters go where the spec says, once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest

from jobs.checkpoints import batch_position, record_stamps
from jobs.kafka.offsets import flatten
from jobs.runconfig import RunConfig
from jobs.sinks.cassandra.store import ORDER, CassandraStore
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce, read_committed
from tests.spark_helpers import drain, forget_last_commit
from tests.stores import cassandra_env, cassandra_keyspace

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

MALFORMED = b"{not json"
SCHEMA = (
    "id STRING, n INT, amount DECIMAL(10,2), at TIMESTAMP, tags ARRAY<STRING>, big BIGINT,"
    " ok BOOLEAN"
)


@pytest.fixture
def keyspace():
    """(session, name): a keyspace of the test's own, dropped at the end."""
    with cassandra_keyspace() as found:
        yield found


def cassandra_arguments(keyspace: str) -> dict:
    env = cassandra_env()
    return {
        "contact_points": env.hosts.split(","),
        "local_datacenter": env.dc,
        "keyspace": keyspace,
        "username": env.user,
        "password": env.password,
        "tls": None,
    }


def config(
    tmp_path,
    topic,
    keyspace,
    sink_dsn,
    kafka_bootstrap,
    *,
    schema=SCHEMA,
    source=None,
    transform=None,
    **sink,
):
    """A pipeline reading `topic` into table `sink['table']` of `keyspace`, its dead letters
    into the sink database's table (or where `sink` says)."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": schema,
            "starting_offsets": "earliest",
            "max_records_per_batch": 100,
            **(source or {}),
        },
        "sink": {
            "kind": "cassandra",
            "connection": "cass",
            "dead_letters": {"connection": "pg"},
            **sink,
        },
        "transform": transform,
    }
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True)
    return RunConfig(
        pipeline=name,
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [kafka_bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / name / "checkpoint"),
        run_dir=str(run_dir),
        sink_configs=(
            {
                "cassandra": cassandra_arguments(keyspace),
                "postgres": {"conninfo": sink_dsn},
                "kafka": {"bootstrap_servers": [kafka_bootstrap]},
            },
        ),
    )


def record(i: int, n: int | None = None) -> dict:
    return {
        "id": f"r{i}",
        "n": i if n is None else n,
        "amount": f"{i}.25",
        "at": f"2026-11-28T10:{i % 60:02d}:00Z",
        "tags": [f"t{i}", "x"],
        "big": 2**40 + i,
        "ok": i % 2 == 0,
    }


def rows(session, table: str) -> dict[str, tuple]:
    found = session.execute(
        f"SELECT id, n, amount, at, tags, big, ok, writetime(n) AS stamp FROM {table}"
    )
    return {r.id: r for r in found}


def batches(checkpoint: str) -> list[int]:
    from pathlib import Path

    return sorted(int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*"))


def end_offsets(checkpoint: str, batch: int) -> dict[tuple[str, int], int]:
    import json
    from pathlib import Path

    lines = (Path(checkpoint) / "offsets" / str(batch)).read_text().splitlines()
    return flatten(json.loads(lines[2]))


def stamps_of(checkpoint: str, done: list[int]) -> dict[int, set[int]]:
    """Per batch, the stamps its records get (each record its own: jobs.checkpoints.
    record_stamps), from the offset log."""
    out = {}
    for b in done:
        added = record_stamps(checkpoint, b)
        assert added is not None, f"batch {b}: no stamps of its own"
        end = end_offsets(checkpoint, b)
        start = end_offsets(checkpoint, b - 1) if b else dict.fromkeys(end, 0)
        out[b] = {added[tp] + o for tp in end for o in range(start.get(tp, 0), end[tp])}
    return out


def letters(sink_dsn: str, pipeline: str) -> list[bytes]:
    with psycopg.connect(sink_dsn) as conn:
        found = conn.execute(
            'SELECT raw FROM _cp_dead_letters WHERE pipeline = %s ORDER BY "offset"', [pipeline]
        ).fetchall()
    return [bytes(r[0]) for r in found]


def test_rows_land_with_their_values_types_and_position_stamps(
    spark, kafka_bootstrap, sink_dsn, keyspace, tmp_path
):
    session, name = keyspace
    topic = new_topic(kafka_bootstrap)
    cfg = config(
        tmp_path, topic, name, sink_dsn, kafka_bootstrap, table="orders", partition_key=["id"]
    )
    produce(kafka_bootstrap, topic, [record(i) for i in range(250)])
    produce(kafka_bootstrap, topic, [MALFORMED, b""])
    drain(spark, cfg)
    # The table was created from the output, with the declared primary key.
    types = {
        r.column_name: (r.type, r.kind)
        for r in session.execute(
            "SELECT column_name, type, kind FROM system_schema.columns"
            " WHERE keyspace_name = %s AND table_name = 'orders'",
            [name],
        )
    }
    assert types == {
        "id": ("text", "partition_key"),
        "n": ("int", "regular"),
        "amount": ("decimal", "regular"),
        "at": ("timestamp", "regular"),
        "tags": ("list<text>", "regular"),
        "big": ("bigint", "regular"),
        "ok": ("boolean", "regular"),
    }
    found = rows(session, "orders")
    assert len(found) == 250
    r7 = found["r7"]
    assert (r7.n, r7.amount, r7.tags, r7.big, r7.ok) == (
        7,
        Decimal("7.25"),
        ["t7", "x"],
        2**40 + 7,
        False,
    )
    assert r7.at.replace(tzinfo=UTC) == datetime(2026, 11, 28, 10, 7, tzinfo=UTC)
    # Every cell is stamped with its record's position: each its own, those of a batch
    # above every stamp of the batch before and below the batch's own position.
    done = batches(cfg.checkpoint)
    assert len(done) >= 3  # 100 records a batch at most
    expected = stamps_of(cfg.checkpoint, done)
    stamps = {r.stamp for r in found.values()}
    assert len(stamps) == 250
    assert stamps <= set().union(*expected.values())
    for b in done:
        low = batch_position(cfg.checkpoint, b - 1) if b else -1
        assert low < min(expected[b]) <= max(expected[b]) < batch_position(cfg.checkpoint, b)
    # The records that do not parse are in the sink database's dead-letter table, once.
    assert sorted(letters(sink_dsn, cfg.pipeline)) == sorted([MALFORMED, b""])


def test_a_replayed_batch_changes_nothing_and_a_late_older_write_never_wins(
    spark, kafka_bootstrap, sink_dsn, keyspace, tmp_path
):
    session, name = keyspace
    topic = new_topic(kafka_bootstrap, partitions=1)
    cfg = config(
        tmp_path, topic, name, sink_dsn, kafka_bootstrap, table="latest", partition_key=["id"]
    )
    # r2 twice in a batch: the later record wins (its stamp is higher).
    produce(
        kafka_bootstrap,
        topic,
        [record(1, n=1), record(2, n=21), record(2, n=20)],
        partitions=1,
    )
    drain(spark, cfg)
    produce(kafka_bootstrap, topic, [record(1, n=2), MALFORMED], partitions=1, start=3)
    drain(spark, cfg)
    first, second = batches(cfg.checkpoint)
    before = rows(session, "latest")
    assert (before["r1"].n, before["r2"].n) == (2, 20)
    tp = (topic, 0)
    assert before["r1"].stamp == record_stamps(cfg.checkpoint, second)[tp] + 3
    assert before["r2"].stamp == record_stamps(cfg.checkpoint, first)[tp] + 2
    # The driver died after the writes, before Spark's commit: the batch is replayed.
    forget_last_commit(cfg.checkpoint)
    drain(spark, cfg)
    after = rows(session, "latest")
    assert {k: (r.n, r.stamp) for k, r in after.items()} == {
        k: (r.n, r.stamp) for k, r in before.items()
    }
    assert letters(sink_dsn, cfg.pipeline) == [MALFORMED]
    # A zombie task of the first batch writes its rows again, late: they lose.
    store = CassandraStore(cassandra_arguments(name), cfg.spec.sink, cfg.pipeline)
    store.open({"id": "string", "n": "int"})
    stale = spark.createDataFrame([("r1", 1, 0)], f"id STRING, n INT, {ORDER} BIGINT")
    store.write(
        spark,
        stale,
        store.config(stale.columns, order=ORDER, stamp=batch_position(cfg.checkpoint, first)),
    )
    assert rows(session, "latest")["r1"].n == 2


def test_an_older_event_never_wins_when_stamped_by_event_time(
    spark, kafka_bootstrap, sink_dsn, keyspace, tmp_path
):
    session, name = keyspace
    topic = new_topic(kafka_bootstrap, partitions=1)
    cfg = config(
        tmp_path,
        topic,
        name,
        sink_dsn,
        kafka_bootstrap,
        table="by_time",
        partition_key=["id"],
        write_time_column="at",
    )
    newer = {**record(1, n=2), "at": "2026-11-28T10:05:00Z"}
    older = {**record(1, n=1), "at": "2026-11-28T10:00:00Z"}
    produce(kafka_bootstrap, topic, [newer], partitions=1)
    drain(spark, cfg)
    produce(kafka_bootstrap, topic, [older], partitions=1, start=1)  # arrives later
    drain(spark, cfg)
    found = rows(session, "by_time")["r1"]
    assert found.n == 2
    assert found.stamp == int(datetime(2026, 11, 28, 10, 5, tzinfo=UTC).timestamp() * 1_000_000)


def test_a_stateful_count_in_update_mode_lands_as_upserts_and_letters_go_to_a_topic(
    spark, kafka_bootstrap, sink_dsn, keyspace, tmp_path
):
    session, name = keyspace
    topic, dead = new_topic(kafka_bootstrap), new_topic(kafka_bootstrap)
    cfg = config(
        tmp_path,
        topic,
        name,
        sink_dsn,
        kafka_bootstrap,
        schema="id STRING, at TIMESTAMP",
        table="counts",
        partition_key=["id"],
        clustering_key=["hour"],
        dead_letters={"connection": "k", "topic": dead},
        source={"watermark": {"column": "at", "delay_seconds": 3600}},
        transform={
            "sql": "SELECT id, window(at, '1 hour').start AS hour, count(*) AS n FROM source"
            " GROUP BY id, window(at, '1 hour')",
            "output_mode": "update",
        },
    )
    at = "2026-11-28T10:15:00Z"
    produce(kafka_bootstrap, topic, [{"id": f"k{i % 3}", "at": at} for i in range(30)])
    drain(spark, cfg)
    produce(kafka_bootstrap, topic, [{"id": "k0", "at": at} for _ in range(5)] + [MALFORMED])
    drain(spark, cfg)
    found = {(r.id, r.n) for r in session.execute("SELECT id, hour, n FROM counts")}
    assert found == {("k0", 15), ("k1", 10), ("k2", 10)}
    assert [v for _, v, _ in read_committed(kafka_bootstrap, dead)] == [MALFORMED]
