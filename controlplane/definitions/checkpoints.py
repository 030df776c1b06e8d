"""Where each pipeline's checkpoint lives, and the one way the control plane reaches it.

Every reader and writer of checkpoints in the control plane goes through here: the launcher
(what a driver is told), the checkpoint page and API, the offsets, the lag computed from the
checkpoint, the state size, restore points (taking, restoring, setting aside, pruning),
offsets resets and deletion. The checkpoint root (CONTROLPLANE_CHECKPOINT_ROOT) is a local
path, `hdfs://...` or `s3a://...`; jobs.storage opens the store it names with the
settings' addresses and keys, and every call to HDFS or S3 is bounded by
CONTROLPLANE_STORAGE_TIMEOUT_SECONDS (raising jobs.storage.StorageError).

Layout under the root, on a local disk and on S3:

    <root>/<pipeline>/                       a pipeline's checkpoint (Spark's)
    <root>/_restore_points/<pipeline>/<id>/  restore points (copies, or set-aside checkpoints)

On HDFS, everything of a pipeline name is in one directory, which is made snapshottable:

    <root>/<pipeline>/checkpoint/            the checkpoint
    <root>/<pipeline>/restore-points/<id>/   set-aside checkpoints (and copies where
                                             snapshots are not allowed)
    <root>/<pipeline>/.snapshot/<id>/checkpoint   a restore point taken of the checkpoint

A restore point taken is then an HDFS snapshot, which costs the NameNode a few bytes; HDFS
refuses to rename or delete a directory that has snapshots, so the checkpoint itself is not
the snapshottable directory (it is set aside by a rename within it).
"""

from __future__ import annotations

import os

from django.conf import settings

from jobs import checkpoints as spark_checkpoints
from jobs.storage import Storage, StorageSettings, join, storage_for

RESTORE_POINTS = "_restore_points"


def storage_settings() -> StorageSettings:
    return StorageSettings(
        hdfs_http=settings.CONTROLPLANE_HDFS_HTTP_ADDRESS,
        hdfs_user=settings.CONTROLPLANE_HDFS_USER,
        s3_endpoint=settings.CONTROLPLANE_S3_ENDPOINT,
        s3_region=settings.CONTROLPLANE_S3_REGION or "us-east-1",
        s3_access_key=settings.CONTROLPLANE_S3_ACCESS_KEY,
        s3_secret_key=settings.CONTROLPLANE_S3_SECRET_KEY,
        s3_path_style=settings.CONTROLPLANE_S3_PATH_STYLE,
        timeout=settings.CONTROLPLANE_STORAGE_TIMEOUT_SECONDS,
    )


def root() -> str:
    """The checkpoint root, as drivers are given it (a local path is made absolute)."""
    value = os.fspath(settings.CONTROLPLANE_CHECKPOINT_ROOT)
    return value.rstrip("/") if "://" in value else os.path.abspath(value)


def store() -> Storage:
    """The store the checkpoint root is on."""
    return storage_for(root(), storage_settings())


def is_local() -> bool:
    return store().scheme == "file"


def _name(pipeline) -> str:
    return pipeline if isinstance(pipeline, str) else pipeline.name


def snapshot_dir(pipeline) -> str | None:
    """The directory snapshots of the pipeline's checkpoint are taken of (HDFS), or None
    where the store has no snapshots."""
    return join(root(), _name(pipeline)) if store().scheme == "hdfs" else None


def location(pipeline) -> str:
    """The checkpoint of `pipeline` (a Pipeline or a name)."""
    if store().scheme == "hdfs":
        return join(root(), _name(pipeline), "checkpoint")
    return join(root(), _name(pipeline))


def restore_points_location(pipeline) -> str:
    if store().scheme == "hdfs":
        return join(root(), _name(pipeline), "restore-points")
    return join(root(), RESTORE_POINTS, _name(pipeline))


def for_driver() -> dict:
    """What a driver's run.json/app.json says of storage (jobs.hadoop, jobs.pipeline)."""
    return storage_settings().for_driver(root())


def ensure_root() -> None:
    """The root exists before a driver starts (a local directory; on HDFS a directory; on
    S3 nothing is needed)."""
    store().makedirs(root())


def read(pipeline, *, history: int = 20, sizes: bool = True):
    """The pipeline's checkpoint (jobs.checkpoints.Checkpoint), or None before its first
    batch; raises StorageError when its store cannot be reached in time."""
    return spark_checkpoints.read_checkpoint(
        location(pipeline), history=history, sizes=sizes, store=store()
    )


def read_at(path: str, *, history: int = 20, sizes: bool = True):
    """A checkpoint (or a restore point's copy) at `path`, on the checkpoint root's store."""
    return spark_checkpoints.read_checkpoint(path, history=history, sizes=sizes, store=store())


def start_offsets(pipeline) -> dict:
    """The offsets the pipeline's query started from, as its checkpoint recorded them."""
    return spark_checkpoints.source_start_offsets(location(pipeline), store())
