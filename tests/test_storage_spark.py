"""Spark on real HDFS and S3 (s3proxy), configured as a driver is (jobs.hadoop.session_conf):
streaming checkpoints on hdfs:// and s3a://, and the files sink staging, rolling and reading
back on each. HDFS and the S3 server are started by `./stack test`, which exports where they
are (CONTROLPLANE_HDFS_URL and _HTTP_ADDRESS, CONTROLPLANE_S3_ENDPOINT, _ACCESS_KEY,
_SECRET_KEY); without those the module is skipped, saying so.

One Spark application for the suite (the `spark` fixture): the plane's S3A and HDFS client
settings go into its Hadoop configuration for this module (as `spark.hadoop.*` puts them into
a driver's), and each test's queries run in a session of their own with the checkpoint
manager session_conf picks for the root.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from jobs import hadoop
from jobs.batch import stream_id
from jobs.runconfig import RunConfig
from jobs.sinks.files import store as files
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import drain

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

NEEDED = (
    "CONTROLPLANE_S3_ENDPOINT",
    "CONTROLPLANE_S3_ACCESS_KEY",
    "CONTROLPLANE_S3_SECRET_KEY",
    "CONTROLPLANE_HDFS_URL",
    "CONTROLPLANE_HDFS_HTTP_ADDRESS",
)
STORES = ("s3a", "hdfs")


@pytest.fixture(scope="module")
def storage() -> dict:
    """The plane's storage as the launcher hands it to drivers (without checkpoint_root)."""
    missing = [name for name in NEEDED if not os.environ.get(name)]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not set: HDFS and the S3 server are started, and their"
            " addresses exported, by `./stack test`"
        )
    return {
        "s3": {
            "endpoint": os.environ["CONTROLPLANE_S3_ENDPOINT"],
            "region": "us-east-1",
            "path_style": True,
            "access_key": os.environ["CONTROLPLANE_S3_ACCESS_KEY"],
            "secret_key": os.environ["CONTROLPLANE_S3_SECRET_KEY"],
        },
        "hdfs": {
            "http": os.environ["CONTROLPLANE_HDFS_HTTP_ADDRESS"],
            "user": os.environ.get("CONTROLPLANE_HDFS_USER") or None,
        },
        "timeout_seconds": 10,
    }


@pytest.fixture(scope="module")
def hadoop_conf(spark, storage):
    """The application's Hadoop configuration with the plane's S3A and HDFS client settings
    (session_conf's `spark.hadoop.*`), put back as it was after the module."""
    conf = spark._jsc.hadoopConfiguration()
    given = hadoop.session_conf({**storage, "checkpoint_root": "s3a://controlplane/x"})
    settings = {
        key.removeprefix("spark.hadoop."): value
        for key, value in given.items()
        if key.startswith("spark.hadoop.")
    }
    saved = {key: conf.get(key) for key in settings}
    for key, value in settings.items():
        conf.set(key, value)
    yield conf
    for key, value in saved.items():
        if value is None:
            conf.unset(key)
        else:
            conf.set(key, value)


@pytest.fixture(scope="module")
def roots(spark, hadoop_conf):
    """A root of this module's own on S3 and on HDFS, deleted at its end."""
    unique = f"tests/spark-{uuid.uuid4().hex[:10]}"
    bucket = os.environ.get("CONTROLPLANE_S3_BUCKET") or "controlplane"
    found = {
        "s3a": f"s3a://{bucket}/{unique}",
        "hdfs": f"{os.environ['CONTROLPLANE_HDFS_URL'].rstrip('/')}/{unique}",
    }
    yield found
    for root in found.values():
        fs, path = _fs(spark, hadoop_conf, root)
        fs.delete(path, True)


def _fs(spark, conf, uri: str):
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(conf), path


def _names(spark, conf, uri: str) -> set[str]:
    fs, path = _fs(spark, conf, uri)
    return {status.getPath().getName() for status in fs.listStatus(path)}


def _renames(spark, conf, uri: str) -> int:
    """Renames S3A did so far in this application (its file system's own statistics)."""
    fs, _ = _fs(spark, conf, uri)
    return int(fs.getIOStatistics().counters().get("op_rename"))


def session_for(spark, storage, root: str):
    """A session whose checkpoints under `root` are written by the manager a driver with
    that checkpoint root gets."""
    session = spark.newSession()
    conf = hadoop.session_conf({**storage, "checkpoint_root": root})
    session.conf.set(hadoop.CHECKPOINT_MANAGER, conf[hadoop.CHECKPOINT_MANAGER])
    return session


def test_spark_redacts_the_s3_keys_it_is_given(spark):
    """Spark's own redaction (its UI's environment page, event logs) hides both keys with
    the default `spark.redaction.regex`, which no setting of ours overrides."""
    jvm = spark._jvm
    assert spark.sparkContext.getConf().get("spark.redaction.regex") is None
    given = hadoop.session_conf(
        {
            "checkpoint_root": "s3a://b/cp",
            "s3": {"endpoint": "http://s3", "access_key": "AKID-1", "secret_key": "SECRET-1"},
        }
    )
    pairs = jvm.java.util.ArrayList()
    for key, value in given.items():
        pairs.add(jvm.scala.Tuple2(key, value))
    shown = jvm.org.apache.spark.util.Utils.redact(
        spark.sparkContext._jsc.sc().conf(),
        jvm.scala.jdk.javaapi.CollectionConverters.asScala(pairs).toSeq(),
    ).toString()
    assert "spark.hadoop.fs.s3a.access.key,*********(redacted)" in shown
    assert "spark.hadoop.fs.s3a.secret.key,*********(redacted)" in shown
    assert "AKID-1" not in shown and "SECRET-1" not in shown
    assert "spark.hadoop.fs.s3a.endpoint,http://s3" in shown  # not everything is hidden


def _noop_query(session, bootstrap: str, topic: str, checkpoint: str):
    """Kafka (100 records a batch) into Spark's no-op sink until the topic is drained."""
    query = (
        session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 100)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


@pytest.mark.parametrize("kind", STORES)
def test_a_query_keeps_its_checkpoint_there_and_resumes_from_it(
    spark, storage, hadoop_conf, roots, kafka_bootstrap, kind
):
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, ({"i": i} for i in range(250)), partitions=1)
    root = f"{roots[kind]}/noop"
    checkpoint = f"{root}/checkpoint"
    session = session_for(spark, storage, root)
    renames = _renames(spark, hadoop_conf, roots["s3a"])
    query = _noop_query(session, kafka_bootstrap, topic, checkpoint)
    assert [p["numInputRows"] for p in query.recentProgress] == [100, 100, 50]
    # Batches 0-2 planned and committed, in files of their final names (none left over).
    assert _names(spark, hadoop_conf, f"{checkpoint}/offsets") == {"0", "1", "2"}
    assert _names(spark, hadoop_conf, f"{checkpoint}/commits") == {"0", "1", "2"}
    if kind == "s3a":
        # Written in place: the query renamed nothing (the FileSystem-based manager renames
        # each of its files, a copy and a delete on S3).
        assert _renames(spark, hadoop_conf, roots["s3a"]) == renames
    # A restart reads its checkpoint back: the next batch takes only the new records.
    produce(kafka_bootstrap, topic, ({"i": i} for i in range(250, 280)), partitions=1)
    query = _noop_query(session_for(spark, storage, root), kafka_bootstrap, topic, checkpoint)
    assert [(p["batchId"], p["numInputRows"]) for p in query.recentProgress] == [(3, 30)]
    assert _names(spark, hadoop_conf, f"{checkpoint}/commits") == {"0", "1", "2", "3"}


def _files_config(storage, root: str, topic: str, bootstrap: str, run_dir) -> RunConfig:
    """Kafka into three files sinks under `root`, Parquet, JSON lines and Avro, its
    checkpoint there too; rolled by hand (targets and intervals far away)."""
    sink = {"kind": "files", "connection": "lake", "target_file_mb": 64}
    sink |= {"max_file_age_seconds": 3600, "inactivity_seconds": 3600}
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
            "max_records_per_batch": 1000,
        },
        "sinks": [
            {**sink, "path": "out/parquet", "format": "parquet"},
            {**sink, "path": "out/json", "format": "json"},
            {**sink, "path": "out/avro", "format": "avro"},
        ],
    }
    lake = {"files": {"root": f"{root}/lake"}}
    return RunConfig(
        pipeline=f"s-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={},
        checkpoint=f"{root}/checkpoint",
        run_dir=str(run_dir),
        sink_configs=(lake, lake, lake),
        # One task a batch, one staged file per sink: a few requests each on S3.
        default_partitions=1,
        storage={**storage, "checkpoint_root": root},
    )


def _roll(session, config: RunConfig) -> None:
    query = stream_id(config.checkpoint, config.store)
    for i, sink in enumerate(config.spec.all_sinks()):
        root = config.sink_configs[i]["files"]["root"]
        files.FilesStore(session, files.base_uri(root, sink.path), sink, query).roll(
            time.time(), flush=True
        )


def _events(start: int, stop: int):
    return ({"id": f"e{i}", "n": i} for i in range(start, stop))


@pytest.mark.parametrize("kind", STORES)
def test_the_files_sink_stages_rolls_and_reads_back_there_exactly_once(
    spark, storage, hadoop_conf, roots, kafka_bootstrap, kind, tmp_path
):
    topic = new_topic(kafka_bootstrap, partitions=1)
    produce(kafka_bootstrap, topic, _events(0, 300), partitions=1)
    root = f"{roots[kind]}/files"
    config = _files_config(storage, root, topic, kafka_bootstrap, tmp_path)
    session = session_for(spark, storage, root)
    renames = _renames(spark, hadoop_conf, roots["s3a"])
    drain(session, config)
    out = f"{root}/lake/out"
    # Staged only: nothing is visible to readers until a roll.
    assert _names(spark, hadoop_conf, f"{out}/parquet") == {"_cp_staging"}
    _roll(session, config)
    # The restart: the checkpoint and the sinks' markers read back from the store.
    produce(kafka_bootstrap, topic, _events(300, 400), partitions=1)
    drain(session_for(spark, storage, root), config)
    _roll(session, config)
    want = sorted(f"e{i}" for i in range(400))
    for fmt in ("parquet", "json", "avro"):
        base = f"{out}/{fmt}"
        finished = sorted(n for n in _names(spark, hadoop_conf, base) if not n.startswith("_"))
        assert finished == [f"part-00000001.{fmt}", f"part-00000002.{fmt}"]
        ids = [r.id for r in session.read.format(fmt).load(base).select("id").collect()]
        assert sorted(ids) == want
        manifest = [
            json.loads(files_text(spark, hadoop_conf, f"{base}/_cp_manifest/{name}"))
            for name in sorted(_names(spark, hadoop_conf, f"{base}/_cp_manifest"))
        ]
        assert [(e["file"], e["rows"]) for e in manifest] == [
            (finished[0], 300),
            (finished[1], 100),
        ]
    if kind == "s3a":
        # Staged, committed, rolled and checkpointed on S3 without a rename (a copy there).
        assert _renames(spark, hadoop_conf, roots["s3a"]) == renames


def files_text(spark, conf, uri: str) -> str:
    return spark._jvm.controlplane.spark.FileSink.read(uri, conf)


def _put(spark, conf, uri: str, text: str) -> None:
    fs, path = _fs(spark, conf, uri)
    out = fs.create(path, True)
    out.write(bytearray(text.encode()))
    out.close()


def _strings(spark, values):
    array = spark.sparkContext._gateway.new_array(spark._jvm.String, len(values))
    for i, value in enumerate(values):
        array[i] = value
    return array


def test_on_s3_a_finished_file_appears_by_its_upload_never_by_a_rename(spark, hadoop_conf, roots):
    """The roll's merge on S3 (FileSink.mergeInto) writes the finished file under its name:
    one upload, no rename (a copy and a delete there); a merge that fails leaves nothing
    under the name, and the plan's re-run writes it whole. The sink's small files
    (FileSink.create: markers, plans, manifest) are put in place too, first writer wins."""
    jfs = spark._jvm.controlplane.spark.FileSink
    base = f"{roots['s3a']}/inplace"
    assert jfs.writesInPlace(base, hadoop_conf)
    assert not jfs.writesInPlace(roots["hdfs"], hadoop_conf)
    staged = [f"{base}/_cp_staging/q/0/a.json", f"{base}/_cp_staging/q/1/b.json"]
    _put(spark, hadoop_conf, staged[0], '{"id": "e0"}\n{"id": "e1"}\n')
    _put(spark, hadoop_conf, staged[1], '{"id": "e2"}')
    merging, final = f"{base}/_cp_staging/_merging/1.json", f"{base}/part-00000001.json"

    # An input gone mid-merge: the upload is aborted, nothing appears under either name.
    missing = _strings(spark, [*staged, f"{base}/_cp_staging/q/2/gone.json"])
    with pytest.raises(Exception, match=r"gone\.json"):
        jfs.mergeInto("json", missing, merging, final, hadoop_conf)
    assert not jfs.exists(final, hadoop_conf)
    assert not jfs.exists(merging, hadoop_conf)

    renames = _renames(spark, hadoop_conf, base)
    size, rows = jfs.mergeInto("json", _strings(spark, staged), merging, final, hadoop_conf)
    assert (size, rows) == (len('{"id": "e0"}\n{"id": "e1"}\n{"id": "e2"}\n'), 3)
    assert files_text(spark, hadoop_conf, final).splitlines() == [
        '{"id": "e0"}',
        '{"id": "e1"}',
        '{"id": "e2"}',
    ]
    assert not jfs.exists(merging, hadoop_conf)
    # A re-run of the plan (its driver died before the manifest entry) writes it again.
    assert list(jfs.mergeInto("json", _strings(spark, staged), merging, final, hadoop_conf)) == [
        size,
        rows,
    ]
    marker = f"{base}/_cp_staging/q/_batches/0.json"
    assert jfs.create(marker, '{"batch": 0}', hadoop_conf)
    assert not jfs.create(marker, '{"batch": "again"}', hadoop_conf)
    assert files_text(spark, hadoop_conf, marker) == '{"batch": 0}'
    assert _renames(spark, hadoop_conf, base) == renames
    assert _names(spark, hadoop_conf, f"{base}/_cp_staging/q/_batches") == {"0.json"}


def test_on_hdfs_a_finished_file_is_merged_aside_and_renamed_into_place(spark, hadoop_conf, roots):
    jfs = spark._jvm.controlplane.spark.FileSink
    base = f"{roots['hdfs']}/aside"
    staged = f"{base}/_cp_staging/q/0/a.json"
    _put(spark, hadoop_conf, staged, '{"id": "e0"}\n')
    merging, final = f"{base}/_cp_staging/_merging/1.json", f"{base}/part-00000001.json"
    assert list(jfs.mergeInto("json", _strings(spark, [staged]), merging, final, hadoop_conf)) == [
        13,
        1,
    ]
    assert files_text(spark, hadoop_conf, final) == '{"id": "e0"}\n'
    assert not jfs.exists(merging, hadoop_conf)
    # Where a rename is atomic the name is taken once: a second merge into it is refused.
    with pytest.raises(Exception, match="appeared while"):
        jfs.mergeInto("json", _strings(spark, [staged]), merging, final, hadoop_conf)
