"""Records gone before a pipeline read them, on a real Kafka broker, with both readers.

Records are really removed from the broker's log: with DeleteRecords, and by retention
(the broker's own log cleaner, after the topic's retention.ms is lowered). Restarted over the
same checkpoint, a pipeline with `fail_on_data_loss: true` (the default) fails in a way the
restart policy classifies as permanent; with `false` it goes on from the first record still
there, and the sink holds exactly the records that were not deleted.

Also: the offsets a pipeline mirrors into `source.consumer_group` are read back by a real
consumer group member (subscribe(): JoinGroup/SyncGroup on the broker) and by Kafka's own
group tool (kafka-consumer-groups' ConsumerGroupCommand), whose LAG is the unread records.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

from controlplane.supervision.restarts import classify
from jobs.checkpoints import read_checkpoint
from jobs.kafka.group_commit import GroupCommitter, mirror
from jobs.pipeline import start_query
from jobs.reporting import ProgressPoller
from jobs.run import wait
from jobs.runconfig import RunConfig
from tests import kafka_helpers
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import events, fetch
from tests.spark_helpers import run_config as pipeline_config
from tests.waiting import wait_for, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

# Both Kafka readers: Spark's connector (the default) and the Python reader.
READERS = ["spark-kafka", "python"]
LOSS = "data loss (fail_on_data_loss is true)"
PARTITIONS = 3
ROOT = Path(__file__).resolve().parent.parent

# How long the retention test may wait for the broker's log cleaner to run. It runs every
# log.retention.check.interval.ms: a broker that checks less often than this allows
# (the default is 5 minutes) cannot take part, and the test is skipped saying so.
RETENTION_WAIT_SECONDS = 90


def run_config(tmp_path, topic, sink_dsn, bootstrap, *, reader, consumer_group=None):
    return pipeline_config(
        tmp_path, topic, sink_dsn, reader=reader, consumer_group=consumer_group, bootstrap=bootstrap
    )


def tolerating_loss(config: RunConfig) -> RunConfig:
    """The same pipeline and checkpoint, with `fail_on_data_loss: false`."""
    source = dataclasses.replace(config.spec.source, fail_on_data_loss=False)
    return dataclasses.replace(config, spec=dataclasses.replace(config.spec, source=source))


def drain(spark, config, poller_callbacks=()):
    """Run the query until the topic is drained; its progress, read as jobs.run reads it, goes
    to `poller_callbacks`."""
    query = start_query(spark, config, available_now=True)
    try:
        wait(query, Path(config.checkpoint).parent, ProgressPoller(query, list(poller_callbacks)))
        assert not query.isActive, "the query did not drain the topic"
    finally:
        query.stop()


def failure(spark, config) -> str:
    """Start the query, which must fail: the text of its exception."""
    query = start_query(spark, config, available_now=True)
    try:
        with pytest.raises(Exception) as raised:  # pyspark's StreamingQueryException
            query.awaitTermination(180)
        return str(raised.value)
    finally:
        query.stop()


def landed(dsn, config) -> list[str]:
    """The ids in the pipeline's table, sorted, duplicates kept."""
    return sorted(r[0] for r in fetch(dsn, f'SELECT id FROM "{config.spec.sink.table}"'))


def ids(numbers) -> list[str]:
    return sorted(f"e{i}" for i in numbers)


# produce() sends record i to partition i % 3: in a fresh topic, at offset i // 3.
def partition_of(i: int) -> int:
    return i % PARTITIONS


def offset_of(i: int) -> int:
    return i // PARTITIONS


def committed(config) -> dict[int, int]:
    """The end offsets of the checkpoint's last committed batch, by partition."""
    checkpoint = read_checkpoint(config.checkpoint)
    assert checkpoint is not None, "the query left no checkpoint"
    return {p: o for (_, p), o in checkpoint.committed_offsets().items()}


def log_bounds(bootstrap, topic) -> tuple[dict[int, int], dict[int, int]]:
    """(log start offsets, log end offsets) by partition, from the broker."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        start = consumer.beginning_offsets(tps)
        end = consumer.end_offsets(tps)
    finally:
        consumer.close()
    return {tp.partition: o for tp, o in start.items()}, {tp.partition: o for tp, o in end.items()}


def admin(bootstrap) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap)


def assert_data_loss(error: str, topic: str) -> None:
    assert classify(error) == LOSS, error
    assert topic in error, error


def assert_no_lost_record_landed(dsn, config, final: list[str]) -> None:
    """After the failed run: what the first run wrote, and maybe some of the batch that
    failed (Spark's connector fails in the executors, where tasks of partitions that lost
    nothing may have committed theirs), but nothing twice and nothing deleted."""
    now = landed(dsn, config)
    assert len(now) == len(set(now)), "a record landed twice"
    assert set(ids(range(300))) <= set(now) <= set(final), now


# -- DeleteRecords -----------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", READERS)
def test_records_deleted_before_they_were_read(spark, kafka_bootstrap, sink_dsn, tmp_path, reader):
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS)
    produce(kafka_bootstrap, topic, events(0, 300))  # offsets 0..99 of each partition
    config = run_config(tmp_path, topic, sink_dsn, kafka_bootstrap, reader=reader)
    drain(spark, config)
    assert landed(sink_dsn, config) == ids(range(300))
    assert committed(config) == {0: 100, 1: 100, 2: 100}

    produce(kafka_bootstrap, topic, events(300, 600), start=300)  # offsets 100..199, unread
    # Partition 0 loses its first 50 unread records, partition 1 all 100, partition 2 none.
    delete_to = {0: 150, 1: 200, 2: 0}
    client = admin(kafka_bootstrap)
    try:
        client.delete_records({TopicPartition(topic, p): o for p, o in delete_to.items() if o})
    finally:
        client.close()
    assert log_bounds(kafka_bootstrap, topic) == (delete_to, {0: 200, 1: 200, 2: 200})

    kept = [i for i in range(300, 600) if offset_of(i) >= delete_to[partition_of(i)]]
    assert len(kept) == 150
    error = failure(spark, config)
    assert_data_loss(error, topic)
    assert_no_lost_record_landed(sink_dsn, config, ids([*range(300), *kept]))

    drain(spark, tolerating_loss(config))
    assert landed(sink_dsn, config) == ids([*range(300), *kept])
    assert committed(config) == {0: 200, 1: 200, 2: 200}


# -- Retention ---------------------------------------------------------------------------------


def broker_config(bootstrap, name: str) -> str:
    client = admin(bootstrap)
    try:
        broker = str(client.describe_cluster()["brokers"][0]["broker_id"])
        found = client.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, broker, {name: None})],
            config_filter="all",
        )
    finally:
        client.close()
    return found["broker"][broker][name]["value"]


def topic_config(bootstrap, topic: str, name: str) -> str:
    client = admin(bootstrap)
    try:
        found = client.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {name: None})], config_filter="all"
        )
    finally:
        client.close()
    return found["topic"][topic][name]["value"]


def set_topic_config(bootstrap, topics, name: str, value: str) -> None:
    """Set a topic config, and wait until the broker (not only the controller) has it."""
    client = admin(bootstrap)
    try:
        client.alter_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, {name: value}) for t in topics]
        )
    finally:
        client.close()
    for t in topics:
        wait_until(
            lambda t=t: topic_config(bootstrap, t, name) == value,
            30,
            f"{t} {name} to be {value}",
            every=0.5,  # an admin client per poll
        )


def retention_topic(bootstrap) -> str:
    """A topic in small segments, rolled every second; retention is lowered later, so
    that nothing expires before the pipeline has read its first records."""
    name = f"ret-{uuid.uuid4().hex[:10]}"
    kafka_helpers.CREATED.add(name)
    client = admin(bootstrap)
    try:
        configs = {"segment.bytes": str(1024 * 1024), "segment.ms": "1000"}
        client.create_topics([NewTopic(name, PARTITIONS, 1, topic_configs=configs)])
    finally:
        client.close()
    return name


@pytest.fixture(scope="module")
def expired(spark, kafka_bootstrap, tmp_path_factory):
    """For each reader, a pipeline that drained 300 records and was stopped; then 300 more
    it never read expired (retention) and 30 were produced after them. One wait for the
    broker's log cleaner serves both readers."""
    interval = int(broker_config(kafka_bootstrap, "log.retention.check.interval.ms")) / 1000
    if interval > RETENTION_WAIT_SECONDS - 15:
        pytest.skip(
            f"the broker applies retention every {interval:g} s "
            "(log.retention.check.interval.ms, not a dynamic config): more than this test "
            f"waits ({RETENTION_WAIT_SECONDS} s)"
        )
    sink_dsn = os.environ["CONTROLPLANE_SINK_DATABASE_URL"]
    pipelines = {}
    for reader in READERS:
        topic = retention_topic(kafka_bootstrap)
        produce(kafka_bootstrap, topic, events(0, 300))
        config = run_config(
            tmp_path_factory.mktemp(f"retention-{reader}"),
            topic,
            sink_dsn,
            kafka_bootstrap,
            reader=reader,
        )
        drain(spark, config)
        assert landed(sink_dsn, config) == ids(range(300))
        produce(kafka_bootstrap, topic, events(300, 600), start=300)  # never read
        pipelines[reader] = config
    topics = [c.spec.source.topics[0] for c in pipelines.values()]
    set_topic_config(kafka_bootstrap, topics, "retention.ms", "1000")

    def expired_everywhere():
        return all(log_bounds(kafka_bootstrap, t)[0] == {0: 200, 1: 200, 2: 200} for t in topics)

    # Polled every 0.5 s: a consumer per topic per poll.
    wait_until(
        expired_everywhere, RETENTION_WAIT_SECONDS, "retention to delete the records", every=0.5
    )
    # Back to a week, before records that must stay are produced.
    set_topic_config(kafka_bootstrap, topics, "retention.ms", str(7 * 24 * 3600 * 1000))
    for topic in topics:
        produce(kafka_bootstrap, topic, events(600, 630), start=600)
        bounds = log_bounds(kafka_bootstrap, topic)
        assert bounds == ({0: 200, 1: 200, 2: 200}, {0: 210, 1: 210, 2: 210})
    return pipelines


@pytest.mark.timeout(300)
@pytest.mark.parametrize("reader", READERS)
def test_records_expired_by_retention_before_they_were_read(spark, sink_dsn, expired, reader):
    config = expired[reader]
    final = ids([*range(300), *range(600, 630)])
    error = failure(spark, config)
    assert_data_loss(error, config.spec.source.topics[0])
    assert_no_lost_record_landed(sink_dsn, config, final)

    drain(spark, tolerating_loss(config))
    assert landed(sink_dsn, config) == final
    assert committed(config) == {0: 210, 1: 210, 2: 210}


# -- The consumer group mirror, read back by Kafka's own group machinery -----------------------


@dataclasses.dataclass(frozen=True)
class Mirrored:
    topic: str
    group: str
    unread: list[str]  # the ids produced after the pipeline drained the topic


@pytest.fixture(scope="module", params=READERS)
def mirrored(request, spark, kafka_bootstrap, tmp_path_factory) -> Mirrored:
    """A pipeline with `source.consumer_group` drained 300 records, its offsets mirrored as
    jobs/run.py does; then 150 more records were produced."""
    reader = request.param
    topic = new_topic(kafka_bootstrap, partitions=PARTITIONS)
    group = f"cp-mirror-{uuid.uuid4().hex[:10]}"
    produce(kafka_bootstrap, topic, events(0, 300))
    config = run_config(
        tmp_path_factory.mktemp(f"mirror-{reader}"),
        topic,
        os.environ["CONTROLPLANE_SINK_DATABASE_URL"],
        kafka_bootstrap,
        reader=reader,
        consumer_group=group,
    )
    # As jobs.run.serve wires it: the query's progress, read by its poller, to the mirror.
    committer = GroupCommitter(config.kafka, config.spec.source.consumer_group)
    try:
        drain(spark, config, [mirror(committer, config.pipeline)])
        ends = {(topic, p): 100 for p in range(PARTITIONS)}
        wait_until(lambda: committer.committed == ends, 30, "offsets mirrored to the group")
    finally:
        committer.close()
    assert committer.failures == 0
    produce(kafka_bootstrap, topic, events(300, 450), start=300)
    return Mirrored(topic, group, ids(range(300, 450)))


@pytest.mark.timeout(300)
def test_a_subscribed_member_of_the_group_reads_only_what_the_pipeline_did_not(
    kafka_bootstrap, mirrored
):
    consumer = KafkaConsumer(
        group_id=mirrored.group,
        bootstrap_servers=kafka_bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # what it reads if the group held no offsets
    )
    got: list[str] = []
    try:
        consumer.subscribe([mirrored.topic])

        def read_the_unread() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(_id(r) for r in records)
            return len(got) >= len(mirrored.unread)

        wait_for(read_the_unread, 60, every=0)  # each poll waits up to 0.5 s for records
        for records in consumer.poll(timeout_ms=1000).values():  # nothing more must come
            got.extend(_id(r) for r in records)
        # Partitions came from the group's assignment, not from assign().
        assert consumer.assignment() == {TopicPartition(mirrored.topic, p) for p in range(3)}
    finally:
        consumer.close(autocommit=False)
    assert sorted(got) == mirrored.unread


def _id(record) -> str:
    return json.loads(record.value)["id"]


def kafka_tools_classpath() -> str | None:
    """Kafka's jars, if they include the command-line tools (org.apache.kafka:kafka-tools)."""
    var = Path(os.environ.get("CONTROLPLANE_VAR_DIR") or ROOT / "var")
    for libs in (var / "kafka" / "libs", ROOT / "var" / "kafka" / "libs"):
        if any(libs.glob("kafka-tools-[0-9]*.jar")):
            return f"{libs}/*"
    return None


@pytest.mark.timeout(300)
def test_kafka_s_group_tool_shows_the_records_the_pipeline_did_not_read_as_lag(
    kafka_bootstrap, mirrored
):
    classpath = kafka_tools_classpath()
    if classpath is None:
        pytest.skip(
            "Kafka's command-line tools are not in var/kafka/libs: scripts/kafka/pom.xml "
            "needs org.apache.kafka:kafka-tools"
        )
    java = shutil.which("java")
    assert java, "no java on PATH"
    done = subprocess.run(
        [
            java,
            "-cp",
            classpath,
            "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
            "--describe",
            "--group",
            mirrored.group,
            "--bootstrap-server",
            kafka_bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header = next(cells for cells in lines if "LAG" in cells and "PARTITION" in cells)
    rows = [dict(zip(header, cells, strict=False)) for cells in lines if mirrored.topic in cells]
    lag = {int(r["PARTITION"]): int(r["LAG"]) for r in rows}
    offsets = {int(r["PARTITION"]): int(r["CURRENT-OFFSET"]) for r in rows}
    assert offsets == {0: 100, 1: 100, 2: 100}, done.stdout
    assert lag == {0: 50, 1: 50, 2: 50}, done.stdout
    assert sum(lag.values()) == len(mirrored.unread)
