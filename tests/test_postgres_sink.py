"""The Postgres sink's staging and commit protocol, against a real Postgres (no Spark)."""

from __future__ import annotations

import uuid

import psycopg
import pyarrow as pa
import pytest

from jobs.sinks.postgres.store import Column, MixedWritesError, PostgresStore


@pytest.fixture
def sink(sink_dsn):
    def make(mode="append", key=()):
        s = PostgresStore(
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


def chunks(*pairs, size=1):
    """What a Spark task streams: record batches, each with no dead letters."""
    return [(batch, None) for batch in table(*pairs).to_batches(max_chunksize=size)]


def dead_letters(*offsets, partition=0):
    return pa.table(
        {
            "topic": ["t"] * len(offsets),
            "partition": [partition] * len(offsets),
            "offset": list(offsets),
            "timestamp": [None] * len(offsets),
            "value": [b"{oops"] * len(offsets),
            "error": ["does not parse"] * len(offsets),
        }
    )


def dead_letter_offsets(sink, dsn):
    with psycopg.connect(dsn) as conn:
        return [
            (p, o)
            for p, o in conn.execute(
                'SELECT partition, "offset" FROM _cp_dead_letters WHERE pipeline = %s'
                " ORDER BY 1, 2",
                (sink.pipeline,),
            ).fetchall()
        ]


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


# -- direct writes: every partition commits with its own marker ---------------------------------


def test_a_partition_written_directly_lands_once_however_often_its_task_runs(sink, sink_dsn):
    s = sink()
    assert s.write_part(0, 0, chunks(("a", 1), ("b", 2))) == (2, 0)
    # A retried task, or a replayed batch: it still reads (and counts) what Spark sends.
    assert s.write_part(0, 0, chunks(("a", 1), ("b", 2))) == (2, 0)
    s.write_part(0, 1, chunks(("c", 3)))
    assert rows(s, sink_dsn) == [("a", 1), ("b", 2), ("c", 3)]


def test_a_batch_is_committed_only_once_its_own_marker_is_written(sink, sink_dsn):
    """Partitions committed directly do not make the batch committed: a replay after a crash
    between them and the batch marker must still run the partitions that are missing."""
    s = sink()
    s.write_part(3, 0, chunks(("a", 1)))
    assert not s.committed(3)
    s.write_part(3, 1, chunks(("b", 2)))
    assert s.finish_batch(3, rows=2) is True
    assert s.committed(3)
    assert s.finish_batch(3, rows=2) is False  # a replay of the batch's end
    assert rows(s, sink_dsn) == [("a", 1), ("b", 2)]


def test_dead_letters_are_written_with_the_batch_marker_and_only_once(sink, sink_dsn):
    s = sink()
    dead = pa.table(
        {
            "topic": ["t", "t"],
            "partition": [0, 1],
            "offset": [7, 9],
            "timestamp": [None, None],
            "value": [b"{oops", None],
            "error": ["does not parse", "empty value (null)"],
        }
    )
    s.finish_batch(0, rows=0, dead_letters=dead)
    s.finish_batch(0, rows=0, dead_letters=dead)
    with psycopg.connect(sink_dsn) as conn:
        got = conn.execute(
            'SELECT partition, "offset", raw FROM _cp_dead_letters WHERE pipeline = %s'
            " ORDER BY partition",
            (s.pipeline,),
        ).fetchall()
    assert [(p, o, r and bytes(r)) for p, o, r in got] == [(0, 7, b"{oops"), (1, 9, None)]


def test_a_batch_partly_written_directly_is_never_staged_on_top(sink, sink_dsn):
    """If the pipeline changed between a crash and the replay so that the batch is now
    staged, staging it would write the directly committed partitions twice: refuse."""
    s = sink()
    s.write_part(4, 0, chunks(("a", 1)))
    s.prepare_stage(4)
    s.write_stage_part(4, 0, table(("a", 1)))
    s.write_stage_part(4, 1, table(("b", 2)))
    with pytest.raises(MixedWritesError, match="partly written directly"):
        s.commit_stage(4)
    assert rows(s, sink_dsn) == [("a", 1)]
    assert not s.committed(4)


def test_a_partition_streams_rows_and_dead_letters_in_one_transaction(sink, sink_dsn):
    s = sink()
    stream = [
        (table(("a", 1), ("b", 2)).to_batches()[0], dead_letters(7)),
        (table(("c", 3)), None),
        (table(("d", 4)), dead_letters(9, 10)),
    ]
    assert s.write_part(2, 0, stream) == (4, 3)
    assert s.write_part(2, 0, stream) == (4, 3)  # the retry writes nothing
    assert rows(s, sink_dsn) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert dead_letter_offsets(s, sink_dsn) == [(0, 7), (0, 9), (0, 10)]


def test_a_partition_that_fails_mid_stream_leaves_nothing_behind(sink, sink_dsn):
    """The task dies while its transaction is open: no rows, no dead letters, no marker, so
    the retry writes the partition in full."""
    s = sink()

    def dying():
        yield table(("a", 1)), dead_letters(1)
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        s.write_part(0, 0, dying())
    assert rows(s, sink_dsn) == []
    assert dead_letter_offsets(s, sink_dsn) == []
    assert s.write_part(0, 0, chunks(("a", 1), ("b", 2))) == (2, 0)
    assert rows(s, sink_dsn) == [("a", 1), ("b", 2)]
