"""The Postgres sink's JVM writer (jobs/java/src/main/java/controlplane/spark/PgCopyWriter.java,
jobs/sinks/jvm_writer.py; its encoders' own JUnit tests: `python -m jobs.jvm test`):
its choice of encodings and JDBC settings (pure), and every column type it sends, written
by real Spark into a real Postgres and compared with what the Python writer stores."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from decimal import Context, Decimal

import psycopg
import pytest

from jobs.batch import for_copy, for_jvm
from jobs.sinks.postgres import pgbinary
from jobs.sinks.postgres.jvm import (
    INT2_FROM_BYTE,
    JSONB,
    NUMERIC,
    TEXT,
    TIMESTAMP,
    WRITER_CONF,
    JvmWriter,
    column_encoding,
    jdbc_target,
)
from jobs.sinks.postgres.store import ORDINAL, PART, Column, PostgresStore

# -- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spark_type", "oid", "expected"),
    [
        ("string", pgbinary.TEXT, TEXT),
        ("varchar(20)", pgbinary.VARCHAR, TEXT),
        ("string", pgbinary.JSONB, JSONB),
        ("tinyint", pgbinary.INT2, INT2_FROM_BYTE),
        ("timestamp", pgbinary.TIMESTAMPTZ, TIMESTAMP),
        ("decimal(12,3)", 1700, NUMERIC),
        # No encoding: the caller writes from Python, which converts.
        ("int", pgbinary.INT8, None),
        ("double", pgbinary.TEXT, None),
        ("decimal(12,3)", pgbinary.FLOAT8, None),
        ("array<int>", pgbinary.JSONB, None),
    ],
)
def test_column_encodings_pair_a_spark_type_with_a_target_column_type(spark_type, oid, expected):
    assert column_encoding(spark_type, oid) == expected


def test_a_url_dsn_becomes_a_jdbc_url_and_properties():
    url, props = jdbc_target(
        {"conninfo": "postgresql://app@db.example:6543/warehouse?sslmode=require", "password": "pw"}
    )
    assert url == "jdbc:postgresql://db.example:6543/warehouse"
    assert props == {"user": "app", "password": "pw", "sslmode": "require"}


def test_several_hosts_and_an_ipv6_literal():
    url, _ = jdbc_target({"conninfo": "host=a,::1 port=1,2 dbname=d user=u"})
    assert url == "jdbc:postgresql://a:1,[::1]:2/d"


@pytest.mark.parametrize(
    "conninfo",
    [
        "dbname=d user=u",  # no host: libpq uses a Unix socket
        "host=/var/run/postgresql dbname=d",
        "host=db dbname=d sslcert=/c.pem sslkey=/k.pem",  # client certificates
    ],
)
def test_connections_the_jdbc_driver_cannot_open_leave_the_writing_to_python(conninfo):
    assert jdbc_target({"conninfo": conninfo}) is None


# -- real Spark and Postgres -------------------------------------------------------------------

SCHEMA = (
    "s STRING, v STRING, j ARRAY<INT>, b BINARY, f BOOLEAN, t TINYINT, sm SMALLINT,"
    " i INT, l BIGINT, fl FLOAT, d DOUBLE, day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ,"
    " wide DECIMAL(38,10), whole DECIMAL(10,0), tiny DECIMAL(5,5)"
)
TYPES = [
    ("s", "string"),
    ("v", "string"),
    ("j", "array<int>"),
    ("b", "binary"),
    ("f", "boolean"),
    ("t", "tinyint"),
    ("sm", "smallint"),
    ("i", "int"),
    ("l", "bigint"),
    ("fl", "float"),
    ("d", "double"),
    ("day", "date"),
    ("ts", "timestamp"),
    ("ntz", "timestamp_ntz"),
    ("wide", "decimal(38,10)"),
    ("whole", "decimal(10,0)"),
    ("tiny", "decimal(5,5)"),
]
EDGE_DECIMALS = [
    "0",
    "1",
    "-1",
    "0.0000000001",
    "-0.0001",
    "9999.9999",
    "10000",
    "100000000",
    "1234567890123456789012345678.0123456789",
    "-9999999999999999999999999999.9999999999",
    "0.5",
    "120000.00001",
]


def rows_for_every_type():
    rnd = random.Random(7)  # noqa: S311 - test data, not secrets
    utc = dt.UTC
    rows = []
    for n in range(300):
        wide = (
            Decimal(EDGE_DECIMALS[n])
            if n < len(EDGE_DECIMALS)
            else Decimal(rnd.randrange(-(10**27), 10**27)).scaleb(-rnd.randrange(0, 11))
        ).quantize(Decimal("1e-10"), context=Context(prec=60))
        rows.append(
            (
                f"text {n} ünïcødé \t tab \\ backslash \n",
                f"v{n}",
                [n, -n, None] if n % 5 else [],
                bytes([n % 256, 0, 255, 10]),
                n % 2 == 0,
                (n % 256) - 128,
                -(n * 7),
                n * 100_003 - 15_000_000,
                n * 10**15 - 2**62,
                n / 7,
                -n / 3.0 if n % 11 else float("inf"),
                dt.date(1969, 12, 31) + dt.timedelta(days=n * 97),
                dt.datetime(1999, 12, 31, 23, 59, 59, 999_999, tzinfo=utc) + dt.timedelta(hours=n),
                dt.datetime(2026, 11, 22, 8, 0) + dt.timedelta(microseconds=n),
                wide,
                Decimal(rnd.randrange(-(10**10) + 1, 10**10)),
                Decimal(rnd.randrange(-(10**5) + 1, 10**5)).scaleb(-5),
            )
        )
    rows.append(tuple([None] * len(TYPES)))  # a NULL in every column
    return rows


def new_sink(dsn, table):
    sink = PostgresStore(
        {"conninfo": dsn}, pipeline=f"p-{uuid.uuid4().hex[:6]}", stream_id="s1", table=table
    )
    sink.ensure_tables([Column(name, kind) for name, kind in TYPES])
    return sink


def stored(dsn, table):
    with psycopg.connect(dsn) as conn:
        return conn.execute(f'SELECT * FROM "{table}" ORDER BY i NULLS LAST, s').fetchall()


@pytest.mark.spark
def test_every_column_type_arrives_as_the_python_writer_stores_it(spark, sink_dsn):
    frame = spark.createDataFrame(rows_for_every_type(), SCHEMA).repartition(3)
    names = [name for name, _ in TYPES]

    jvm_sink = new_sink(sink_dsn, f"t_{uuid.uuid4().hex[:8]}")
    spark.conf.set(WRITER_CONF, "jvm")
    try:
        writer = JvmWriter.create(spark, jvm_sink)
        assert writer.write(for_jvm(frame), 0, names) == (301, 0)
    finally:
        spark.conf.unset(WRITER_CONF)

    python_sink = new_sink(sink_dsn, f"t_{uuid.uuid4().hex[:8]}")
    table = for_copy(frame).toArrow()
    assert python_sink.write_part(0, 0, [(table, None)]) == (301, 0)

    from_jvm, from_python = stored(sink_dsn, jvm_sink.table), stored(sink_dsn, python_sink.table)
    assert len(from_jvm) == 301
    assert from_jvm == from_python
    # And the values are the ones Spark held, decimals digit for digit.
    expected = {r.i: r for r in frame.collect() if r.i is not None}
    for row in from_jvm[:-1]:
        source = expected[row[7]]
        assert (row[0], row[14], row[15], row[16]) == (
            source.s,
            source.wide,
            source.whole,
            source.tiny,
        )
        assert bytes(row[3]) == source.b and row[2] == source.j
    assert from_jvm[-1] == tuple([None] * len(TYPES))


@pytest.mark.spark
def test_a_stage_slice_is_replaced_by_each_attempt_and_committed_whole(spark, sink_dsn):
    """A shuffled batch: every task fills its slice of the batch's stage (no marker); a task
    run again replaces its slice instead of adding to it; the driver commits the stage."""
    from pyspark.sql import functions as F

    frame = spark.createDataFrame(rows_for_every_type(), SCHEMA).repartition(3)
    frame = frame.select(
        "*", F.spark_partition_id().alias(PART), F.monotonically_increasing_id().alias(ORDINAL)
    )
    names = [name for name, _ in TYPES]
    sink = new_sink(sink_dsn, f"t_{uuid.uuid4().hex[:8]}")
    writer = JvmWriter.create(spark, sink)
    sink.prepare_stage(7)
    stage = sink.stage_name(7)
    assert writer.write(for_jvm(frame), 7, names, stage=stage) == (301, 0)
    assert writer.write(for_jvm(frame), 7, names, stage=stage) == (301, 0)  # a retry
    with psycopg.connect(sink_dsn) as conn:
        (staged,) = conn.execute(f'SELECT count(*) FROM "{stage}"').fetchone()
        markers = conn.execute(
            "SELECT count(*) FROM _cp_commits WHERE pipeline = %s", (sink.pipeline,)
        ).fetchone()[0]
    assert (staged, markers) == (301, 0)
    assert sink.commit_stage(7)
    assert len(stored(sink_dsn, sink.table)) == 301


@pytest.mark.spark
def test_a_partition_whose_marker_exists_is_not_written_again(spark, sink_dsn):
    frame = spark.createDataFrame(rows_for_every_type(), SCHEMA).repartition(3)
    names = [name for name, _ in TYPES]
    sink = new_sink(sink_dsn, f"t_{uuid.uuid4().hex[:8]}")
    writer = JvmWriter.create(spark, sink)
    assert writer.write(for_jvm(frame), 4, names) == (301, 0)
    # A task retried or a batch replayed: every partition finds its marker.
    assert writer.write(for_jvm(frame), 4, names) == (301, 0)
    assert len(stored(sink_dsn, sink.table)) == 301
    with psycopg.connect(sink_dsn) as conn:
        parts = conn.execute(
            "SELECT part, rows FROM _cp_commits WHERE pipeline = %s ORDER BY part",
            (sink.pipeline,),
        ).fetchall()
    assert [p for p, _ in parts] == [0, 1, 2] and sum(r for _, r in parts) == 301


@pytest.mark.spark
def test_demanding_the_jvm_writer_where_it_cannot_connect_is_an_error(spark):
    sink = PostgresStore({"conninfo": "dbname=x"}, pipeline="p", table="t")
    spark.conf.set(WRITER_CONF, "jvm")
    try:
        with pytest.raises(RuntimeError, match="JDBC driver"):
            JvmWriter.create(spark, sink)
    finally:
        spark.conf.unset(WRITER_CONF)
    assert JvmWriter.create(spark, sink) is None  # auto: the Python writer


@pytest.mark.spark
def test_connections_kept_between_batches_are_reused_and_replaced_once_broken(spark, sink_dsn):
    """The executors keep idle connections between tasks; one the server closed (a restart
    of the sink database, a failover) is noticed and replaced, not used."""
    frame = spark.createDataFrame(rows_for_every_type(), SCHEMA).repartition(2)
    names = [name for name, _ in TYPES]
    sink = new_sink(sink_dsn, f"t_{uuid.uuid4().hex[:8]}")
    writer = JvmWriter.create(spark, sink)
    app = f"cp:{sink.pipeline}"

    def backends():
        with psycopg.connect(sink_dsn) as conn:
            return {
                pid
                for (pid,) in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,)
                )
            }

    assert writer.write(for_jvm(frame), 0, names) == (301, 0)
    kept = backends()
    assert kept  # idle between batches, not closed
    assert writer.write(for_jvm(frame), 1, names) == (301, 0)
    assert backends() == kept  # the same connections served the next batch
    with psycopg.connect(sink_dsn) as conn:
        for pid in kept:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    assert writer.write(for_jvm(frame), 2, names) == (301, 0)
    assert backends() and not backends() & kept
    assert len(stored(sink_dsn, sink.table)) == 3 * 301
