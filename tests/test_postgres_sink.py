"""The Postgres sink's staging and commit protocol, against a real Postgres (no Spark)."""

from __future__ import annotations

import uuid

import psycopg
import pyarrow as pa
import pytest

from jobs.sinks.postgres import Column, PostgresSink


@pytest.fixture
def sink(sink_dsn):
    def make(mode="append", key=()):
        s = PostgresSink(
            {"conninfo": sink_dsn},
            pipeline=f"p-{uuid.uuid4().hex[:6]}",
            stream_id="s1",
            table=f"t_{uuid.uuid4().hex[:8]}",
            mode=mode,
            key=key,
        )
        s.ensure_tables([Column("id", "string"), Column("n", "bigint")])
        return s

    return make


def rows(sink, dsn):
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute(f'SELECT id, n FROM "{sink.table}"').fetchall())


def table(*pairs):
    return pa.table({"id": [p[0] for p in pairs], "n": [p[1] for p in pairs]})


def test_a_retried_task_replaces_its_slice_instead_of_adding_to_it(sink, sink_dsn):
    s = sink()
    s.prepare_stage(0)
    s.write_stage_part(0, 0, table(("a", 1), ("b", 2)))
    s.write_stage_part(0, 0, table(("a", 1), ("b", 2)))  # the same task, run again
    s.write_stage_part(0, 1, table(("c", 3)))
    assert s.commit_stage(0) is True
    assert rows(s, sink_dsn) == [("a", 1), ("b", 2), ("c", 3)]


def test_a_batch_commits_once_and_its_stage_is_dropped(sink, sink_dsn):
    s = sink()
    s.prepare_stage(5)
    s.write_stage_part(5, 0, table(("a", 1)))
    assert s.commit_stage(5) is True
    assert s.committed(5)
    s.prepare_stage(5)  # Spark replays batch 5
    s.write_stage_part(5, 0, table(("a", 1)))
    assert s.commit_stage(5) is False
    assert rows(s, sink_dsn) == [("a", 1)]
    with psycopg.connect(sink_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename = %s", (s.stage_name(5),)
        )
        assert left.fetchone()[0] == 0


def test_upsert_keeps_the_last_record_by_partition_then_position(sink, sink_dsn):
    s = sink(mode="upsert", key=["id"])
    s.prepare_stage(0)
    s.write_stage_part(0, 0, table(("a", 1), ("a", 2), ("b", 1)))
    s.write_stage_part(0, 1, table(("a", 3)))
    s.commit_stage(0)
    s.prepare_stage(1)
    s.write_stage_part(1, 0, table(("b", 9)))
    s.commit_stage(1)
    assert rows(s, sink_dsn) == [("a", 3), ("b", 9)]


def test_stages_of_batches_that_died_are_cleaned_up(sink, sink_dsn):
    s = sink()
    s.prepare_stage(7)
    s.write_stage_part(7, 0, table(("x", 1)))
    s.drop_stages()
    with psycopg.connect(sink_dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename = %s", (s.stage_name(7),)
        )
        assert left.fetchone()[0] == 0
    assert rows(s, sink_dsn) == []
