"""The Python Data Source Kafka reader against the real broker and a real Spark session."""

from __future__ import annotations

import json
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError
from pyspark.sql.streaming.datasource import ReadAllAvailable

from jobs.kafka.group_commit import GroupCommitter, mirror
from jobs.kafka.offsets import PLAN, flatten
from jobs.kafka.source import KafkaDataSource, KafkaSourceOptions, KafkaStreamReader
from tests.kafka_helpers import new_topic, produce
from tests.waiting import wait_for, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def kafka_spark(spark):
    spark.dataSource.register(KafkaDataSource)
    return spark


def run_available_now(spark, topic, bootstrap, checkpoint, name, **options):
    """Drain what is in the topic now (Trigger.AvailableNow); returns the query's progress list."""
    reader = (
        spark.readStream.format("cp_kafka")
        .option("topics", topic)
        .option("bootstrap_servers", bootstrap)
        .option("starting_offsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query.recentProgress


def rows(spark, name):
    return spark.table(name).select("topic", "partition", "offset", "key", "value").collect()


def test_it_reads_every_record_once_in_bounded_batches(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produced = produce(kafka_bootstrap, topic, ({"id": i} for i in range(3000)))
    progress = run_available_now(
        kafka_spark,
        topic,
        kafka_bootstrap,
        tmp_path / "ck",
        "src_bounded",
        max_records_per_batch=1000,
    )
    got = rows(kafka_spark, "src_bounded")
    assert len(got) == produced
    assert len({(r.partition, r.offset) for r in got}) == produced
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert max(sizes) <= 1000
    assert sum(sizes) == produced


def run_to_files(spark, topic, bootstrap, checkpoint, output, fail_on_data_loss=True):
    """Drain the topic into Parquet files (a sink that, unlike memory, survives a restart)."""
    query = (
        spark.readStream.format("cp_kafka")
        .option("topics", topic)
        .option("bootstrap_servers", bootstrap)
        .option("starting_offsets", "earliest")
        .option("fail_on_data_loss", str(fail_on_data_loss).lower())
        .load()
        .writeStream.format("parquet")
        .option("path", str(output))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()


def test_a_restart_resumes_from_the_checkpoint(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(500)))
    run_to_files(kafka_spark, topic, kafka_bootstrap, tmp_path / "ck", tmp_path / "out")
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(500, 800)), start=500)
    run_to_files(kafka_spark, topic, kafka_bootstrap, tmp_path / "ck", tmp_path / "out")
    keys = [int(r.key) for r in kafka_spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(keys) == list(range(800))  # every record, none twice


def recreate(bootstrap, topic, partitions):
    """Delete the topic and create it again: its logs start over at offset 0."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])

        def created() -> bool:
            admin.create_topics([NewTopic(topic, partitions, 1)])
            return True

        # The broker deletes the topic in the background: "already exists" until it is gone.
        wait_until(created, 30, f"{topic} to be created again", ignore=(TopicAlreadyExistsError,))
    finally:
        admin.close()


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_records_lost_under_the_query_are_detected(
    kafka_spark, kafka_bootstrap, tmp_path, fail_on_data_loss
):
    """The topic is deleted and created again after the query read 30 records: the next
    run fails naming the partition, or (fail_on_data_loss false) resumes at offset 0."""
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(30)), partitions=1)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    run_to_files(kafka_spark, topic, kafka_bootstrap, checkpoint, out)
    recreate(kafka_bootstrap, topic, partitions=1)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(100, 105)), partitions=1)
    if fail_on_data_loss:
        with pytest.raises(Exception, match=f"{topic}-0: the log ends at offset 5 but the query"):
            run_to_files(kafka_spark, topic, kafka_bootstrap, checkpoint, out)
        return
    run_to_files(kafka_spark, topic, kafka_bootstrap, checkpoint, out, fail_on_data_loss=False)
    values = [json.loads(r.value)["id"] for r in kafka_spark.read.parquet(str(out)).collect()]
    assert sorted(values) == list(range(30)) + list(range(100, 105))


def test_partitions_missing_from_the_checkpoint_are_read_from_their_beginning(kafka_bootstrap):
    """A checkpoint written when the topic had fewer partitions (simulated by leaving
    partition 2 out of `start`)."""
    topic = new_topic(kafka_bootstrap, partitions=3)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(30)), partitions=3)
    reader = KafkaStreamReader(
        KafkaSourceOptions({"topics": topic, "bootstrap_servers": kafka_bootstrap})
    )
    try:
        start = {topic: {"0": 10, "1": 10}}
        end = reader.latestOffset(start, ReadAllAvailable())
        assert flatten(end) == {(topic, 0): 10, (topic, 1): 10, (topic, 2): 10}
        assert end[PLAN]["from"] == {topic: {"2": 0}}
        ranges = [p.range for p in reader.partitions(start, end)]
        assert [(r.partition, r.start, r.end) for r in ranges] == [(2, 0, 5), (2, 5, 10)]
    finally:
        reader.stop()


def test_a_replayed_batch_is_cut_exactly_as_the_first_time(kafka_bootstrap):
    """Per-partition commit markers need a replay to read the same input partitions, even
    when the query restarts with other options (more cores) or the log changed meanwhile."""
    topic = new_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(100)), partitions=2)

    def reader(min_partitions):
        options = {
            "topics": topic,
            "bootstrap_servers": kafka_bootstrap,
            "starting_offsets": "earliest",
        }
        return KafkaStreamReader(KafkaSourceOptions({**options, "min_partitions": min_partitions}))

    first, later = reader("2"), reader("7")
    try:
        start = first.initialOffset()
        end = first.latestOffset(start, ReadAllAvailable())
        planned = [p.range for p in first.partitions(start, end)]
        replayed = [p.range for p in later.partitions(start, json.loads(json.dumps(end)))]
        assert replayed == planned
        assert len(planned) == 2
        # Nothing new: the very same offsets come back, so Spark runs no empty batch.
        assert first.latestOffset(end, ReadAllAvailable()) is end
    finally:
        first.stop()
        later.stop()


def test_log_ends_come_from_the_fetch_high_watermark(kafka_bootstrap):
    """Some Kafka-compatible brokers' ListOffsets(latest) miss the tail of the last record
    batch; the reader must not (this test fails if `_end` trusts ListOffsets alone on such a
    broker). On Apache Kafka both agree."""
    topic = new_topic(kafka_bootstrap, partitions=1)
    produced = produce(kafka_bootstrap, topic, ({"id": i} for i in range(1000)), partitions=1)
    reader = KafkaStreamReader(
        KafkaSourceOptions({"topics": topic, "bootstrap_servers": kafka_bootstrap})
    )
    try:
        assert reader._end([(topic, 0)]) == {(topic, 0): produced}
    finally:
        reader.stop()
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    listed = consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    consumer.close()
    assert listed == produced  # Apache Kafka's ListOffsets(latest): the high watermark


def test_per_partition_starting_offsets(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, ({"id": i} for i in range(40)), partitions=2)
    run_available_now(
        kafka_spark,
        topic,
        kafka_bootstrap,
        tmp_path / "ck",
        "src_offsets",
        starting_offsets=f'{{"{topic}": {{"0": 15, "1": -1}}}}',
    )
    got = rows(kafka_spark, "src_offsets")
    assert {(r.partition, r.offset) for r in got} == {(0, o) for o in range(15, 20)}


# An hour ago: records stamped further back than the broker's retention (7 days) are
# deleted by it within seconds (the dev broker checks every 10 s), and a fixed date fell
# behind it (the start-time tests then saw their records vanish midway).
BASE_MS = (int(time.time()) - 3600) * 1000


def test_a_start_time_finds_each_partition_first_record_at_or_after_it(kafka_bootstrap):
    """Record i is stamped BASE + i s, on partition i % 2. The broker's ListOffsets by time is
    checked against the records (a broker answering offset 0 whatever the time is caught)."""
    topic = new_topic(kafka_bootstrap, partitions=2)
    produce(
        kafka_bootstrap,
        topic,
        ({"id": i} for i in range(100)),
        partitions=2,
        timestamp=lambda i: BASE_MS + i * 1000,
    )

    def start_at(ms):
        reader = KafkaStreamReader(
            KafkaSourceOptions(
                {"topics": topic, "bootstrap_servers": kafka_bootstrap, "starting_timestamp": ms}
            )
        )
        try:
            return reader.initialOffset()
        finally:
            reader.stop()

    # i = 50 (partition 0, offset 25) and i = 51 (partition 1, offset 25).
    assert start_at(BASE_MS + 50_000) == {topic: {"0": 25, "1": 25}}
    # i = 51 is the first at or after 50.5 s on both partitions: offsets 26 and 25.
    assert start_at(BASE_MS + 50_500) == {topic: {"0": 26, "1": 25}}
    assert start_at(BASE_MS - 1) == {topic: {"0": 0, "1": 0}}  # before every record
    assert start_at(BASE_MS + 1_000_000) == {topic: {"0": 50, "1": 50}}  # after: the log ends
    assert start_at(BASE_MS + 99_000) == {topic: {"0": 50, "1": 49}}


def test_reading_a_record_tells_none_from_unknown(kafka_bootstrap, monkeypatch):
    """record_time: a record, or None when the range holds only a transaction's commit marker;
    a broker that does not answer raises instead of passing for an empty range (a search by
    time would then start after records it never read)."""
    from kafka import KafkaProducer

    from jobs.kafka import metadata

    topic = new_topic(kafka_bootstrap, partitions=1)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(3):
        producer.send(topic, value=b"x", partition=0, timestamp_ms=BASE_MS + i)
    producer.commit_transaction()
    producer.close()
    tp = TopicPartition(topic, 0)
    consumer = metadata.metadata_consumer({"bootstrap_servers": [kafka_bootstrap]})
    try:
        end = consumer.end_offsets([tp])[tp]
        assert end == 4  # three records and the commit marker
        assert metadata.record_time(consumer, tp, 1, end) == (1, BASE_MS + 1)
        assert metadata.record_time(consumer, tp, 3, end) is None  # only the marker
    finally:
        consumer.close()

    class Silent:
        """A consumer whose fetches never come back."""

        def assign(self, tps):
            pass

        def seek(self, tp, offset):
            self.at = offset

        def poll(self, **kwargs):
            time.sleep(0.01)
            return {}

        def position(self, tp):
            return self.at

    monkeypatch.setattr(metadata, "RECORD_READ_SECONDS", 0.2)
    with pytest.raises(TimeoutError, match="not read within"):
        metadata.record_time(Silent(), tp, 1, end)


def test_a_query_started_at_a_time_reads_from_there(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(
        kafka_bootstrap,
        topic,
        ({"id": i} for i in range(30)),
        partitions=1,
        timestamp=lambda i: BASE_MS + i * 1000,
    )
    run_available_now(
        kafka_spark,
        topic,
        kafka_bootstrap,
        tmp_path / "ck",
        "src_since",
        starting_timestamp=BASE_MS + 20_000,
    )
    assert sorted(r.offset for r in rows(kafka_spark, "src_since")) == list(range(20, 30))


def test_rows_carry_kafka_metadata_with_the_right_types(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, [{"id": 1}], partitions=1)
    run_available_now(kafka_spark, topic, kafka_bootstrap, tmp_path / "ck", "src_types")
    frame = kafka_spark.table("src_types")
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp>"
    )
    (row,) = frame.collect()
    assert (row.key, row.value, row.topic, row.offset) == (b"0", b'{"id": 1}', topic, 0)
    assert row.timestamp is not None


def test_committed_offsets_are_mirrored_to_a_consumer_group(kafka_spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produced = produce(kafka_bootstrap, topic, ({"id": i} for i in range(900)))
    group = f"cp-mirror-{topic}"
    committer = GroupCommitter({"bootstrap_servers": [kafka_bootstrap]}, group)
    offer = mirror(committer)
    try:
        progress = run_available_now(
            kafka_spark,
            topic,
            kafka_bootstrap,
            tmp_path / "ck",
            "src_group",
            max_records_per_batch=400,
        )
        for batch in progress:  # as jobs.reporting.ProgressPoller hands them on
            offer(batch)
        last = (tmp_path / "ck" / "offsets" / "2").read_text().split("\n")[2]
        checkpoint = flatten(json.loads(last))
        assert sum(checkpoint.values()) == produced
        assert wait_for(lambda: committer.committed == checkpoint, timeout=20)
    finally:
        committer.close()
    # What an external lag tool sees: the group's committed offsets, equal to the checkpoint's.
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        seen = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    assert {(tp.topic, tp.partition): m.offset for tp, m in seen.items()} == checkpoint
    assert committer.failures == 0
