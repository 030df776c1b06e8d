"""jobs.hadoop.session_conf: the Spark settings a driver gets for the plane's storage (pure;
tests/test_storage_spark.py runs them against real HDFS and S3)."""

from __future__ import annotations

import json

import pytest

from jobs import hadoop
from jobs.jvm import FILE_SYSTEM_CHECKPOINTS

S3 = {
    "endpoint": "http://127.0.0.1:58333",
    "region": "eu-west-1",
    "path_style": True,
    "access_key": "AKIDEXAMPLE",
    "secret_key": "wJalrXUtnFEMI/K7MDENG",
}


def storage(root, s3=None, hdfs=None, **more):
    return {"checkpoint_root": root, "s3": s3, "hdfs": hdfs, "timeout_seconds": 10, **more}


@pytest.mark.parametrize(
    "root",
    ["/var/lib/controlplane/checkpoints", "file:///srv/cp", "hdfs://127.0.0.1:58020/x"],
)
def test_checkpoints_off_s3_keep_the_file_system_based_manager(root):
    conf = hadoop.session_conf(storage(root, hdfs={"user": "root"}))
    assert conf[hadoop.CHECKPOINT_MANAGER] == FILE_SYSTEM_CHECKPOINTS
    assert not [k for k in conf if ".fs.s3a." in k]


def test_checkpoints_on_s3_are_written_in_place_with_the_given_keys():
    conf = hadoop.session_conf(storage("s3a://controlplane/checkpoints", s3=S3))
    assert conf[hadoop.CHECKPOINT_MANAGER] == "controlplane.spark.AbortableCheckpointFileManager"
    s3a = {k.removeprefix("spark.hadoop.fs.s3a."): v for k, v in conf.items() if ".fs.s3a." in k}
    assert s3a["endpoint"] == "http://127.0.0.1:58333"
    assert s3a["endpoint.region"] == "eu-west-1"
    assert s3a["path.style.access"] == "true"
    assert s3a["connection.ssl.enabled"] == "false"
    assert s3a["aws.credentials.provider"] == (
        "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    )
    assert (s3a["access.key"], s3a["secret.key"]) == ("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG")
    assert all(isinstance(v, str) for v in conf.values())


def test_an_s3_files_sink_beside_local_checkpoints_gets_s3a_but_not_its_manager():
    conf = hadoop.session_conf(storage("/cp", s3={**S3, "endpoint": "https://s3.example"}))
    assert conf[hadoop.CHECKPOINT_MANAGER] == FILE_SYSTEM_CHECKPOINTS
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true"


def test_a_dead_store_fails_an_operation_within_about_a_minute():
    """Every timeout and retry count that bounds a call is set (Hadoop's defaults wait many
    minutes), and the worst case of retries times timeouts stays near a minute."""
    conf = hadoop.session_conf(storage("s3a://b/cp", s3=S3, timeout_seconds=10))

    def seconds(key):
        value = conf[key]
        return (
            float(value.removesuffix("ms")) / 1000
            if value.endswith("ms")
            else float(value.removesuffix("s"))
        )

    s3a = "spark.hadoop.fs.s3a."
    tries = (int(conf[s3a + "retry.limit"]) + 1) * (int(conf[s3a + "attempts.maximum"]) + 1)
    # S3A raises each network timeout to 15 s at least (its minimum operation duration).
    hung = tries * max(
        15, seconds(s3a + "connection.timeout"), seconds(s3a + "connection.establish.timeout")
    )
    assert 30 <= hung <= 60
    # S3A raises a pool wait under 15 s to 15 s (with a warning): asked for as such.
    assert seconds(s3a + "connection.acquisition.timeout") >= 15
    h = "spark.hadoop."
    connect = int(conf[h + "ipc.client.connect.timeout"]) / 1000
    on_timeouts = int(conf[h + "ipc.client.connect.max.retries.on.timeouts"]) + 1
    assert connect * on_timeouts <= 60
    assert int(conf[h + "ipc.client.connect.max.retries"]) <= 3
    assert 0 < int(conf[h + "ipc.client.rpc-timeout.ms"]) <= 60_000
    assert int(conf[h + "dfs.client.failover.max.attempts"]) <= 3
    assert conf[h + "dfs.client.retry.policy.enabled"] == "false"


def test_s3_itself_or_the_default_credentials_when_the_plane_gives_none():
    """What jobs.storage.StorageSettings.for_driver writes for AWS's own S3 (no endpoint)
    and for keys from the machine (none given): S3A's defaults for those, nothing made up."""
    given = {"endpoint": None, "region": "eu-west-1", "path_style": False}
    conf = hadoop.session_conf(storage("s3a://b/cp", s3={**given, "access_key": None}))
    keys = {k.removeprefix("spark.hadoop.fs.s3a.") for k in conf if ".fs.s3a." in k}
    assert not keys & {"endpoint", "connection.ssl.enabled", "aws.credentials.provider"}
    assert not keys & {"access.key", "secret.key"}
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "false"
    # No "s3" at all (no endpoint nor keys to give): the same, with the time bounds.
    conf = hadoop.session_conf(storage("s3a://b/cp"))
    assert conf[hadoop.CHECKPOINT_MANAGER] == hadoop.S3A_CHECKPOINTS
    assert conf["spark.hadoop.fs.s3a.retry.limit"] == "2"
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in conf


def test_the_timeout_scales_the_bounds():
    short = hadoop.session_conf(storage("/cp", s3=S3, timeout_seconds=2))
    long = hadoop.session_conf(storage("/cp", s3=S3, timeout_seconds=30))
    key = "spark.hadoop.fs.s3a.connection.timeout"
    assert (short[key], long[key]) == ("2s", "30s")
    key = "spark.hadoop.ipc.client.rpc-timeout.ms"
    assert (short[key], long[key]) == ("6000", "90000")
    # The control plane's own setting may be under a second: a driver waits a second.
    tiny = hadoop.session_conf(storage("/cp", timeout_seconds=0.5))
    assert tiny["spark.hadoop.ipc.client.connect.timeout"] == "1000"


def test_the_hdfs_user_reaches_cluster_executors_and_the_driver_environment():
    given = storage("hdfs://nn:8020/cp", hdfs={"user": "etl"})
    assert hadoop.session_conf(given)["spark.executorEnv.HADOOP_USER_NAME"] == "etl"
    assert hadoop.driver_env(given) == {"HADOOP_USER_NAME": "etl"}
    assert hadoop.driver_env(storage("/cp")) == {}


def test_secrets_are_nowhere_but_their_two_settings():
    conf = hadoop.session_conf(storage("s3a://b/cp", s3=S3, hdfs={"user": "root"}))
    holding = sorted(k for k, v in conf.items() if S3["secret_key"] in v or S3["access_key"] in v)
    assert holding == ["spark.hadoop.fs.s3a.access.key", "spark.hadoop.fs.s3a.secret.key"]
    assert S3["secret_key"] not in json.dumps(hadoop.driver_env({"s3": S3, "hdfs": None}))


def test_load_reads_the_storage_of_a_run_json(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"pipeline": "p", "storage": storage("s3a://b/cp", s3=S3)}))
    assert hadoop.load(path)[hadoop.CHECKPOINT_MANAGER].endswith("AbortableCheckpointFileManager")
    path.write_text(json.dumps({"pipeline": "p"}))
    assert hadoop.load(path) == {}
    assert hadoop.load(tmp_path / "app.json") == {}


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ([], "storage: must be an object"),
        ({"checkpoint_root": ""}, "storage.checkpoint_root: must be a path or a URI"),
        (storage("gs://b/cp"), "storage.checkpoint_root: scheme 'gs' is not one of"),
        (storage("/cp", s3={**S3, "secret_key": ""}), "storage.s3: access_key and secret_key"),
        (storage("/cp", s3={**S3, "region": 1}), "storage.s3.region: must be a string"),
        (storage("/cp", s3={**S3, "endpoint": "ftp://x"}), "storage.s3.endpoint: must be an"),
        (storage("/cp", timeout_seconds=0), "storage.timeout_seconds: must be more than 0"),
        (storage("/cp", timeout_seconds="10"), "storage.timeout_seconds: must be a number"),
        (storage("/cp", timeout_seconds=float("nan")), "storage.timeout_seconds: must be a"),
        (storage("/cp", hdfs="root"), "storage.hdfs: must be an object"),
    ],
)
def test_a_storage_that_cannot_configure_a_session_is_refused_by_its_field(given, problem):
    with pytest.raises(hadoop.StorageError) as refused:
        hadoop.session_conf(given)
    assert str(refused.value).startswith(problem)
    assert S3["secret_key"] not in str(refused.value)
