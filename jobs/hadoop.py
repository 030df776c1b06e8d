"""The Spark settings a driver's session is built with for where the plane keeps its data:
checkpoints and files sinks on a local disk, HDFS (`hdfs://`) or S3 (`s3a://`, Hadoop's S3A
with the jars jobs/java ships: hadoop-aws and a slim AWS SDK v2).

The launcher puts the plane's storage into run.json / app.json (mode 0600) as a plain dict:

    {"checkpoint_root": "s3a://bucket/checkpoints" | "hdfs://host:port/path" | "/local/path",
     "s3": {"endpoint": "http://127.0.0.1:58333", "region": "us-east-1", "path_style": true,
            "access_key": "...", "secret_key": "..."} | None,
     "hdfs": {"http": "127.0.0.1:58870", "user": "root"} | None,
     "timeout_seconds": 10}

and the driver builds its SparkSession with `session_conf(storage)`. The S3 keys are in the
returned settings only: they reach the JVM through the session builder (a driver started by
spark-submit hands them over py4j, not on a command line), and Spark redacts them wherever it
shows its configuration (`spark.redaction.regex`, whose default matches `secret` and
`access.key`: `fs.s3a.secret.key` and `fs.s3a.access.key`; tests/test_storage_spark.py checks
it against the JVM's own default). Hadoop redacts them in its own dumps
(`hadoop.security.sensitive-config-keys`).

Time bounds. Hadoop's defaults wait a long time for a store that is down: S3A retries each
request 7 times on top of the SDK's 5 attempts with a 200 s socket timeout, and the HDFS
client retries a refused NameNode connection 10 times and a timed-out one 45 times, 20 s
each (15 minutes). A streaming batch should fail instead, within about a minute, and let the
control plane's restart policy (which says why, in words) take over. From `timeout_seconds`
(T, 10 by default):
- S3A: connect and socket-read timeouts T, a whole request 3T (S3A raises each of these to
  15 s at least), no retry inside the AWS SDK (S3A's own retries wrap the SDK's: their counts
  multiply) and 2 S3A retries 0.5 s apart, which S3A makes only where a request can be
  repeated. Measured here with a server that accepts and never answers: an operation fails
  after 49 s (92 s with one SDK retry on top, minutes with the defaults); with nothing
  listening, in a few seconds. Throttling (503 Slow Down) is retried 5 times from 1 s,
  doubling: ~30 s, then the batch fails.
- HDFS (Hadoop IPC and the DFS client): NameNode connect timeout T, 2 retries on a refused
  connection (1 s apart: a stopped NameNode fails a call in ~2 s, measured) and 2 on a
  timed-out one (3T), every call bounded by 3T (`ipc.client.rpc-timeout.ms`: a NameNode that
  accepts but does not answer failed a call in 30 s here; Hadoop's default waits for ever,
  pinging; a NameNode call that legitimately takes longer fails too, none of a driver's
  does), DataNode socket timeout 3T; with an HA NameNode pair, 3 fail-overs at most, 0.5 s
  then up to T apart. The retry policy of `dfs.client.retry.policy.enabled` (minutes of
  retries) stays off. And a file's close polls the NameNode sooner (see _hdfs).

Checkpoint file manager: on S3 the checkpoint's files are written in place and appear on
close (`controlplane.spark.AbortableCheckpointFileManager`: S3A's rename is a copy and a
delete); elsewhere Spark's FileSystem-based one with its atomic renames (jobs.jvm).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .jvm import FILE_SYSTEM_CHECKPOINTS

# jobs/java/src/main/java/controlplane/spark/AbortableCheckpointFileManager.java
S3A_CHECKPOINTS = "controlplane.spark.AbortableCheckpointFileManager"
S3A_CREDENTIALS = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
DEFAULT_TIMEOUT_SECONDS = 10
# The bounds a driver's timeouts are held in, whatever the plane's setting
# (CONTROLPLANE_STORAGE_TIMEOUT_SECONDS, for the control plane's own requests, may be 0.5 s):
# a second at least, and ten minutes, longer than which a wait is a hang by another name.
MIN_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS = 1, 600
# Per scheme a checkpoint root may have, its checkpoint file manager: S3 has no atomic rename,
# so S3A's writes a checkpoint file in one PUT (and aborts it on failure).
CHECKPOINT_MANAGERS = {
    "file": FILE_SYSTEM_CHECKPOINTS,
    "hdfs": FILE_SYSTEM_CHECKPOINTS,
    "s3a": S3A_CHECKPOINTS,
}
SCHEMES = tuple(CHECKPOINT_MANAGERS)


class StorageError(ValueError):
    """A storage dict that cannot configure a session (the launcher wrote it wrong)."""


def scheme(root: str) -> str:
    """The file system a root lives on: "file" for a local path, else its URI scheme."""
    found = urlsplit(root).scheme.lower()
    return found if found and len(found) > 1 else "file"  # "C:" is no scheme


def session_conf(storage: Mapping[str, Any]) -> dict[str, str]:
    """The Spark settings (strings) a driver's SparkSession is built with for `storage`."""
    if not isinstance(storage, Mapping):
        raise StorageError("storage: must be an object")
    root = storage.get("checkpoint_root")
    if not isinstance(root, str) or not root.strip():
        raise StorageError("storage.checkpoint_root: must be a path or a URI")
    kind = scheme(root)
    if kind not in SCHEMES:
        raise StorageError(
            f"storage.checkpoint_root: scheme {kind!r} is not one of {', '.join(SCHEMES)}"
        )
    timeout = _timeout(storage.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS))
    s3, hdfs = storage.get("s3"), storage.get("hdfs")
    conf = {CHECKPOINT_MANAGER: CHECKPOINT_MANAGERS[kind]}
    if s3 or conf[CHECKPOINT_MANAGER] == S3A_CHECKPOINTS:
        # Without an "s3" (AWS's own S3, keys from the machine): S3A's defaults for those,
        # and the time bounds all the same.
        conf.update(_s3a(s3 or {}, timeout))
    # HDFS's client bounds also apply when only a files sink is on HDFS (any hdfs:// URI).
    conf.update(_hdfs(hdfs or {}, timeout))
    if user := driver_env(storage).get("HADOOP_USER_NAME"):
        # Executors in JVMs of their own (a cluster) act as the same HDFS user.
        conf["spark.executorEnv.HADOOP_USER_NAME"] = user
    return conf


def load(path: str | Path) -> dict[str, str]:
    """session_conf() of a run.json / app.json's "storage" ({} when it has none, or there is
    no such file: an application started by hand)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    storage = json.loads(text).get("storage")
    return session_conf(storage) if storage else {}


def driver_env(storage: Mapping[str, Any] | None) -> dict[str, str]:
    """Environment for the driver process (not a secret): who it is to HDFS. Hadoop's simple
    authentication takes the user from HADOOP_USER_NAME when its JVM logs in, before any
    session setting is read, so the launcher sets it in the driver's environment."""
    user = ((storage or {}).get("hdfs") or {}).get("user")
    return {"HADOOP_USER_NAME": str(user)} if user else {}


def _timeout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise StorageError("storage.timeout_seconds: must be a number of seconds")
    if value <= 0:
        raise StorageError("storage.timeout_seconds: must be more than 0")
    return min(MAX_TIMEOUT_SECONDS, max(MIN_TIMEOUT_SECONDS, math.ceil(value)))


def _s3a(s3: Mapping[str, Any], timeout: int) -> dict[str, str]:
    if not isinstance(s3, Mapping):
        raise StorageError("storage.s3: must be an object")
    for key in ("endpoint", "region", "access_key", "secret_key"):
        if s3.get(key) is not None and not isinstance(s3[key], str):
            raise StorageError(f"storage.s3.{key}: must be a string")
    endpoint = s3.get("endpoint") or None  # None: AWS's own
    if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
        raise StorageError("storage.s3.endpoint: must be an http:// or https:// URL")
    keys = (s3.get("access_key") or None, s3.get("secret_key") or None)
    if (keys[0] is None) != (keys[1] is None):
        raise StorageError("storage.s3: access_key and secret_key go together")
    settings = {
        # A region to sign with: without one S3A asks AWS where the bucket is.
        "endpoint.region": s3.get("region") or "us-east-1",
        # Bucket in the path, not the host name: what S3-compatible servers on one address
        # (and loopback) serve.
        "path.style.access": _bool(s3.get("path_style", True)),
        # S3A raises a connect timeout under 15 s to 15 s, with a warning at every start.
        "connection.establish.timeout": f"{max(timeout, 15)}s",
        "connection.timeout": f"{timeout}s",
        "connection.request.timeout": f"{3 * timeout}s",
        # Waiting for a pooled connection: S3A raises anything under 15 s to 15 s (warning).
        "connection.acquisition.timeout": f"{max(timeout, 15)}s",
        "attempts.maximum": "0",
        "retry.limit": "2",
        "retry.interval": "500ms",
        "retry.throttle.limit": "5",
        "retry.throttle.interval": "1000ms",
        # Uploads buffer on local disk (Hadoop's default, said here on purpose): a merged
        # file of the files sink is as large as its target; buffered in the heap ("array",
        # "bytebuffer"), up to 4 blocks of 64 MB per stream would be held in a 1 GB driver.
        # (fs.s3a.fast.upload itself is ignored since Hadoop 3.0: always the block stream.)
        "fast.upload.buffer": "disk",
    }
    if endpoint is not None:
        settings["endpoint"] = endpoint
        settings["connection.ssl.enabled"] = _bool(endpoint.startswith("https:"))
    if keys[0] is not None:
        # Exactly the keys given: not the environment's, an instance profile's or ~/.aws
        # (without keys, Hadoop's default chain of those).
        settings["aws.credentials.provider"] = S3A_CREDENTIALS
        settings["access.key"], settings["secret.key"] = keys
    return {"spark.hadoop.fs.s3a." + key: value for key, value in settings.items()}


def _hdfs(hdfs: Mapping[str, Any], timeout: int) -> dict[str, str]:
    if not isinstance(hdfs, Mapping):
        raise StorageError("storage.hdfs: must be an object")
    ms = 1000 * timeout
    settings = {
        "ipc.client.connect.timeout": str(ms),
        "ipc.client.connect.max.retries": "2",
        "ipc.client.connect.retry.interval": "1000",
        "ipc.client.connect.max.retries.on.timeouts": "2",
        "ipc.client.rpc-timeout.ms": str(3 * ms),
        "dfs.client.socket-timeout": str(3 * ms),
        "dfs.client.retry.policy.enabled": "false",
        "dfs.client.failover.max.attempts": "3",
        "dfs.client.failover.sleep.base.millis": "500",
        "dfs.client.failover.sleep.max.millis": str(ms),
        # Closing a file waits until the NameNode has heard from the DataNode about its last
        # block, polling 400 ms, 800 ms, ... apart by default: a checkpoint file (two per
        # batch) closed before the DataNode reported took 400 ms more (measured here: walCommit
        # ~430 ms every other batch). The report comes within milliseconds, so the first poll
        # is after 10 ms (with 50 ms every small file's close took ~59 ms: bench/storage.py's
        # write_close p50; `dfs.namenode.file.close.num-committed-allowed` does not spare the
        # wait where a block has as many replicas as its minimum). 10 ms doubling over 11
        # tries waits longer in all than Hadoop's default (20.5 s vs 12.4 s) before giving up.
        "dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "10",
        "dfs.client.block.write.locateFollowingBlock.retries": "11",
    }
    return {f"spark.hadoop.{key}": value for key, value in settings.items()}


def _bool(value: Any) -> str:
    return "true" if value else "false"
