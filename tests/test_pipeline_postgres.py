"""Kafka -> Spark -> Postgres, exactly once, with dead letters: real Kafka, Spark, Postgres."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.batch import shuffles, stream_id
from jobs.checkpoints import read_checkpoint
from jobs.pipeline import start_query
from jobs.sinks.postgres.jvm import WRITER_CONF
from jobs.sinks.postgres.store import PostgresStore
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import drain, events, fetch, forget_last_commit, run_config

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

MALFORMED = [
    b"not json at all",
    b'{"id": "m1", "amount": ',
    b"[1, 2, 3]",
    b'{"id": "m2", "amount": "lots"}',
    b"\xff\xfe binary junk",
]


# Both Kafka readers: Spark's connector (the default) and the Python reader.
READERS = ["spark-kafka", "python"]


@pytest.fixture(autouse=True)
def _bootstrap(kafka_bootstrap):
    pytest.kafka_bootstrap = kafka_bootstrap


@pytest.fixture(params=["jvm", "python"])
def writer(request, spark):
    """Both writers of the direct path: the executors' JVM (PgCopyWriter), Python workers."""
    spark.conf.set(WRITER_CONF, request.param)
    yield request.param
    spark.conf.unset(WRITER_CONF)


def batch_lines(caplog) -> list[str]:
    """The job's log line for each batch written: its rows, how, its dead letters."""
    lines = [r.getMessage() for r in caplog.records if r.name == "jobs.pipeline"]
    return [line for line in lines if " rows (" in line]


def written_by(caplog) -> set[str]:
    """How the batches were written, from the job's log lines ("JVM" or "Python")."""
    return {"JVM" if "JVM" in line else "Python" for line in batch_lines(caplog)}


# The three ways a batch is written: without a transform in one pass over Kafka; with a
# transform that keeps partitions stable, written by each partition (by the JVM writer in one
# pass, the unparsed records counted on the way; by Python workers from a cached batch); with
# a shuffle, staged (by the JVM writer in one pass, or by Python workers from a cached batch)
# then committed by the driver.
NARROW = {"sql": "SELECT id, amount, ts FROM source WHERE amount >= 0"}
PATHS = {
    "one pass": None,
    "narrow transform": NARROW,
    "staged": {"sql": "SELECT DISTINCT id, amount, ts FROM source"},
}


@pytest.mark.parametrize("transform", PATHS.values(), ids=PATHS.keys())
@pytest.mark.parametrize("reader", READERS)
def test_valid_records_land_once_and_malformed_ones_become_dead_letters(
    spark, kafka_bootstrap, sink_dsn, tmp_path, transform, writer, caplog, reader
):
    caplog.set_level("INFO", logger="jobs.pipeline")
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 1000) + MALFORMED)
    config = run_config(tmp_path, topic, sink_dsn, reader=reader, transform=transform)
    drain(spark, config)
    assert written_by(caplog) == {"JVM" if writer == "jvm" else "Python"}
    if writer == "jvm" and transform == NARROW:
        # The batch with the malformed records read them again for its dead letters.
        assert any("unparsed records read again" in line for line in batch_lines(caplog))
    table = config.spec.sink.table
    ids = [r[0] for r in fetch(sink_dsn, f'SELECT id FROM "{table}"')]
    assert sorted(ids) == sorted(f"e{i}" for i in range(1000))
    dead = fetch(
        sink_dsn,
        "SELECT raw, error, topic, record_time FROM _cp_dead_letters WHERE pipeline = %s",
        config.pipeline,
    )
    assert sorted(bytes(r[0]) for r in dead) == sorted(MALFORMED)
    assert all(r[1] and r[2] == topic and r[3] is not None for r in dead)


@pytest.mark.parametrize("reader", READERS)
def test_stop_and_start_again_resumes_without_loss_or_duplicates(
    spark, kafka_bootstrap, sink_dsn, tmp_path, reader
):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 700))
    config = run_config(tmp_path, topic, sink_dsn, reader=reader)
    drain(spark, config)
    produce(kafka_bootstrap, topic, events(700, 1200), start=700)
    drain(spark, config)
    table = config.spec.sink.table
    (count, distinct) = fetch(sink_dsn, f'SELECT count(*), count(DISTINCT id) FROM "{table}"')[0]
    assert (count, distinct) == (1200, 1200)


def test_upsert_keeps_one_row_per_key_with_the_latest_value(
    spark, kafka_bootstrap, sink_dsn, tmp_path, writer, caplog
):
    caplog.set_level("INFO", logger="jobs.pipeline")
    topic = new_topic(kafka_bootstrap, partitions=1)
    updates = [{"id": f"k{i % 10}", "amount": float(i), "ts": None} for i in range(1000)]
    produce(kafka_bootstrap, topic, updates + MALFORMED, partitions=1)
    config = run_config(tmp_path, topic, sink_dsn, mode="upsert", key=["id"])
    drain(spark, config)
    rows = dict(fetch(sink_dsn, f'SELECT id, amount FROM "{config.spec.sink.table}"'))
    assert rows == {f"k{k}": float(990 + k) for k in range(10)}
    lines = batch_lines(caplog)
    if writer == "jvm":
        # By key into partitions, each merged with its own marker: no stage, no driver pass.
        assert all("direct, one pass, JVM" in line for line in lines), lines
        parts = {part for _, part in markers(sink_dsn, config.pipeline)}
        assert -1 in parts and len(parts - {-1}) >= 2
    else:
        assert all("staged" in line for line in lines), lines
    (dead,) = fetch(
        sink_dsn, "SELECT count(*) FROM _cp_dead_letters WHERE pipeline = %s", config.pipeline
    )[0]
    assert dead == len(MALFORMED)


def test_an_upsert_that_died_after_some_partitions_committed_is_completed_once(
    spark, kafka_bootstrap, sink_dsn, tmp_path, monkeypatch
):
    """The JVM writer merged some key partitions of batch 1, then the driver died before
    the batch marker: the replay puts every key in the partition it went to the first time,
    so the merged ones are skipped and the others merged, with the latest value per key."""
    topic = new_topic(kafka_bootstrap)
    # Record i goes to Kafka partition i % 3, so each key (i % 48) lives in one partition, as
    # Kafka producers place keys: its order there is the order its records were sent.
    updates = [{"id": f"k{i % 48}", "amount": float(i), "ts": None} for i in range(1200)]
    produce(kafka_bootstrap, topic, updates, partitions=3)
    config = run_config(tmp_path, topic, sink_dsn, mode="upsert", key=["id"])
    dies_before_the_marker_of_batch_1(spark, config, sink_dsn, monkeypatch)
    drain(spark, config)
    rows = dict(fetch(sink_dsn, f'SELECT id, amount FROM "{config.spec.sink.table}"'))
    assert rows == {f"k{k}": float(max(i for i in range(1200) if i % 48 == k)) for k in range(48)}
    assert (1, -1) in markers(sink_dsn, config.pipeline)


@pytest.mark.parametrize("transform", [None, NARROW], ids=["no transform", "narrow transform"])
def test_the_jvm_writer_writes_in_one_pass_and_reads_unparsed_records_again_only_once(
    spark, kafka_bootstrap, sink_dsn, tmp_path, caplog, transform
):
    """Without unparsed records no batch is cached or reads Kafka twice: the count observed
    during the write says there are no dead letters to fetch. The batch that has some reads
    them again; the batches after it write dead letters from their one read."""
    caplog.set_level("INFO", logger="jobs.pipeline")
    spark.conf.set(WRITER_CONF, "jvm")
    try:
        topic = new_topic(kafka_bootstrap, partitions=1)  # batches of 400 offsets, in order
        produce(kafka_bootstrap, topic, events(0, 500), partitions=1)
        config = run_config(tmp_path, topic, sink_dsn, transform=transform)
        drain(spark, config)
        clean = batch_lines(caplog)
        # Two more batches, each ending with the malformed records, read by one query.
        more = events(500, 895) + MALFORMED + events(895, 1095) + MALFORMED
        produce(kafka_bootstrap, topic, more, partitions=1, start=500)
        drain(spark, config)
    finally:
        spark.conf.unset(WRITER_CONF)
    assert clean and all(line.endswith("(direct, one pass, JVM), 0 dead letters") for line in clean)
    after = batch_lines(caplog)[len(clean) :]
    assert "unparsed records read again" in after[0], after
    inline = "with dead letters, JVM" if transform is None else "direct, cached, JVM"
    assert len(after) == 2 and inline in after[1], after
    (count,) = fetch(sink_dsn, f'SELECT count(*) FROM "{config.spec.sink.table}"')[0]
    assert count == 1095
    (dead,) = fetch(
        sink_dsn, "SELECT count(*) FROM _cp_dead_letters WHERE pipeline = %s", config.pipeline
    )[0]
    assert dead == 2 * len(MALFORMED)


def test_the_transform_runs_over_the_source_view(spark, kafka_bootstrap, sink_dsn, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 100))
    config = run_config(
        tmp_path,
        topic,
        sink_dsn,
        transform={"sql": "SELECT id, amount * 2 AS doubled FROM source WHERE amount >= 75"},
    )
    drain(spark, config)
    rows = fetch(sink_dsn, f'SELECT id, doubled FROM "{config.spec.sink.table}" ORDER BY doubled')
    assert len(rows) == 50
    assert rows[0] == ("e50", 150.0)


@pytest.mark.parametrize("reader", READERS)
def test_a_replayed_batch_is_skipped_by_its_commit_marker(
    spark, kafka_bootstrap, sink_dsn, tmp_path, reader
):
    """Spark replays a batch whose sink write committed but whose commit log entry was not
    written (the driver died in between): the marker makes the replay a no-op."""
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 300))
    config = run_config(tmp_path, topic, sink_dsn, reader=reader)
    drain(spark, config)
    forget_last_commit(tmp_path / "checkpoint")
    drain(spark, config)
    (count,) = fetch(sink_dsn, f'SELECT count(*) FROM "{config.spec.sink.table}"')[0]
    assert count == 300


def test_a_new_checkpoint_under_the_same_pipeline_name_is_not_mistaken_for_the_old_one(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    """Batch ids restart at 0 in a new checkpoint: markers are scoped by the query id."""
    first_topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, first_topic, events(0, 100))
    first = run_config(tmp_path / "a", first_topic, sink_dsn)
    drain(spark, first)
    second_topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, second_topic, events(100, 250))
    second = run_config(tmp_path / "b", second_topic, sink_dsn)
    second = dataclasses.replace(
        second,
        pipeline=first.pipeline,
        spec=dataclasses.replace(second.spec, sink=first.spec.sink),
    )
    drain(spark, second)
    (count,) = fetch(sink_dsn, f'SELECT count(*) FROM "{first.spec.sink.table}"')[0]
    assert count == 250


def dies_before_the_marker_of_batch_1(spark, config, sink_dsn, monkeypatch):
    """Run the query until batch 1's partitions are written and the driver "dies" before the
    batch's marker; leaves the sink as it was (for the restart)."""
    finish = PostgresStore.finish_batch

    def dies_at_batch_1(self, batch_id, rows, dead_letters=None):
        if batch_id == 1:
            raise RuntimeError("the driver died here")
        return finish(self, batch_id, rows, dead_letters)

    monkeypatch.setattr(PostgresStore, "finish_batch", dies_at_batch_1)
    query = start_query(spark, config, available_now=True)
    with pytest.raises(Exception, match="the driver died here"):
        query.awaitTermination(180)
    monkeypatch.setattr(PostgresStore, "finish_batch", finish)
    written = markers(sink_dsn, config.pipeline)
    assert (1, -1) not in written and [m for m in written if m[0] == 1], written


def markers(dsn, pipeline):
    return fetch(
        dsn,
        "SELECT batch_id, part FROM _cp_commits WHERE pipeline = %s ORDER BY 1, 2",
        pipeline,
    )


@pytest.mark.parametrize("transform", [PATHS["one pass"], PATHS["narrow transform"]])
@pytest.mark.parametrize("reader", READERS)
def test_a_batch_that_died_after_some_partitions_committed_is_completed_exactly_once(
    spark, kafka_bootstrap, sink_dsn, tmp_path, monkeypatch, transform, writer, reader
):
    """Executors committed their partitions of batch 1, then the driver died before the batch
    marker: the replay writes the batch marker and none of the partitions a second time."""
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 1000) + MALFORMED)
    config = run_config(tmp_path, topic, sink_dsn, reader=reader, transform=transform)
    dies_before_the_marker_of_batch_1(spark, config, sink_dsn, monkeypatch)
    table = config.spec.sink.table
    (landed,) = fetch(sink_dsn, f'SELECT count(*) FROM "{table}"')[0]
    assert 400 < landed <= 800  # batch 0 and the partitions of batch 1

    drain(spark, config)
    assert fetch(sink_dsn, f'SELECT count(*), count(DISTINCT id) FROM "{table}"')[0] == (
        1000,
        1000,
    )
    assert (1, -1) in markers(sink_dsn, config.pipeline)
    (dead,) = fetch(
        sink_dsn, "SELECT count(*) FROM _cp_dead_letters WHERE pipeline = %s", config.pipeline
    )[0]
    assert dead == len(MALFORMED)


def test_a_transform_that_shuffles_is_staged_and_committed_in_one_transaction(
    spark, kafka_bootstrap, sink_dsn, tmp_path, writer, caplog
):
    """After a GROUP BY, Spark partitions are not fixed pieces of the input, so per-partition
    markers would not be safe on a replay: the batch is staged and committed whole."""
    caplog.set_level("INFO", logger="jobs.pipeline")
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 300))
    transform = {"sql": "SELECT substr(id, 1, 2) AS prefix, count(*) AS n FROM source GROUP BY 1"}
    config = run_config(tmp_path, topic, sink_dsn, transform=transform)
    drain(spark, config)
    (total,) = fetch(sink_dsn, f'SELECT sum(n) FROM "{config.spec.sink.table}"')[0]
    assert total == 300
    assert {part for _, part in markers(sink_dsn, config.pipeline)} == {-1}
    how = "staged, one pass, JVM" if writer == "jvm" else "staged"
    assert all(how in line for line in batch_lines(caplog)), batch_lines(caplog)


def test_a_shuffling_transform_upserts_through_the_stage(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    """Counts per prefix, upserted: each batch's count replaces the one before."""
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, events(0, 1000), partitions=1)  # 3 batches of 400 at most
    transform = {"sql": "SELECT substr(id, 1, 2) AS prefix, count(*) AS n FROM source GROUP BY 1"}
    config = run_config(
        tmp_path, topic, sink_dsn, transform=transform, mode="upsert", key=["prefix"]
    )
    drain(spark, config)
    rows = dict(fetch(sink_dsn, f'SELECT prefix, n FROM "{config.spec.sink.table}"'))
    # The last batch holds offsets 800-999: ids e800..e999, all with the prefix "e8" or "e9".
    assert rows["e8"] == 100 and rows["e9"] == 100


@pytest.mark.parametrize("transform", [PATHS["one pass"], PATHS["narrow transform"]])
def test_without_a_shuffle_every_partition_commits_directly(
    spark, kafka_bootstrap, sink_dsn, tmp_path, transform
):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 300))
    config = run_config(tmp_path, topic, sink_dsn, transform=transform)
    drain(spark, config)
    parts = {part for _, part in markers(sink_dsn, config.pipeline)}
    assert -1 in parts and len(parts - {-1}) >= 2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("SELECT id, amount * 2 AS a FROM source WHERE amount > 1", False),
        ("SELECT id FROM source UNION ALL SELECT id FROM source", False),
        ("SELECT id, count(*) FROM source GROUP BY id", True),
        ("SELECT DISTINCT id FROM source", True),
        ("SELECT * FROM source ORDER BY amount", True),
        ("SELECT * FROM source LIMIT 3", True),
        ("SELECT * FROM source ORDER BY amount LIMIT 3", True),
        ("SELECT a.id FROM source a JOIN source b ON a.id = b.id", True),
        ("SELECT id, rank() OVER (PARTITION BY id ORDER BY amount) FROM source", True),
        ("SELECT /*+ COALESCE(1) */ id FROM source", True),
        ("SELECT coalesce(id, 'none') AS id FROM source", False),  # the function: no operator
    ],
)
def test_shuffles_tells_plans_with_stable_partitions_from_the_others(spark, query, expected):
    frame = spark.range(0, 6, 1, 2).selectExpr("CAST(id % 2 AS STRING) AS id", "id * 1.5 AS amount")
    frame = frame.persist()  # as in a batch: the cached input is what the transform reads
    frame.createOrReplaceTempView("source")
    try:
        assert shuffles(spark.sql(query)) is expected
    finally:
        frame.unpersist()


@pytest.mark.parametrize("reader", READERS)
def test_the_checkpoint_tells_the_last_committed_batch_and_offsets_with_no_driver_running(
    spark, kafka_bootstrap, sink_dsn, tmp_path, reader
):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 900))  # 300 per partition, 400 per batch
    config = run_config(tmp_path, topic, sink_dsn, reader=reader)
    drain(spark, config)
    checkpoint = read_checkpoint(config.checkpoint)
    assert checkpoint.query_id == stream_id(config.checkpoint)
    assert checkpoint.reader == reader
    last = checkpoint.last_committed
    assert last.batch_id == 2 and checkpoint.in_flight == []
    assert checkpoint.committed_offsets() == {(topic, 0): 300, (topic, 1): 300, (topic, 2): 300}
    assert [b.batch_id for b in checkpoint.history] == [2, 1, 0]
    assert all(b.committed_at >= b.planned_at for b in checkpoint.history)
    assert checkpoint.size_bytes > 0
    # A batch whose WAL entry exists but whose commit does not is in flight.
    commit = tmp_path / "checkpoint" / "commits" / "2"
    commit.unlink()
    (commit.parent / ".2.crc").unlink(missing_ok=True)
    checkpoint = read_checkpoint(config.checkpoint)
    assert (checkpoint.last_committed.batch_id, checkpoint.in_flight) == (1, [2])
    assert read_checkpoint(tmp_path / "nowhere") is None
