"""The kill tests' pipelines off the local disk: the control plane's checkpoint root and a
files connection's root on real HDFS or on the S3 server (tests.stores), and what the tests
read back from there (through jobs.storage, as the control plane does, and through the test's
own Spark session, as a reader of the finished files would).

`off_disk` is used as a fixture's body: it makes a fresh root on the store, points the
control plane's settings at it (as tests.stores.checkpoint_store does), creates the files
connection `lake` there and, given the shared Spark session, gives the session the store's
client settings (jobs.hadoop.session_conf, as a driver gets them) to read it back; at the end
it kills the drivers still running (a failed test's) and removes the root.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.json as pj

from jobs import hadoop
from jobs.sinks.files import store as files
from jobs.storage import Storage, join, storage_for
from tests.stores import base_for, settings_for


@dataclass(frozen=True)
class OffDisk:
    kind: str  # "hdfs" or "s3"
    root: str  # the test's own root on the store; the checkpoints and the lake are in it
    store: Storage  # jobs.storage's view of it, with the plane's settings
    lake: str  # the files connection `lake`'s root

    def base(self, path: str) -> str:
        """A files sink's directory (`path` in the sink's spec)."""
        return files.base_uri(self.lake, path)


def off_disk(kind: str, api, settings, tmp_path, spark=None) -> Iterator[OffDisk]:
    """See the module's docstring. Depends on job_dirs having set the local roots first."""
    from controlplane.definitions import checkpoints
    from controlplane.definitions.models import Run, RunState
    from controlplane.supervision import launcher

    reach = settings_for(kind)
    root = base_for(kind, tmp_path)
    store = storage_for(root, reach)
    checkpoint_root = join(root, "checkpoints")
    settings.CONTROLPLANE_CHECKPOINT_ROOT = checkpoint_root
    settings.CONTROLPLANE_HDFS_HTTP_ADDRESS = reach.hdfs_http
    settings.CONTROLPLANE_HDFS_USER = reach.hdfs_user
    settings.CONTROLPLANE_S3_ENDPOINT = reach.s3_endpoint
    settings.CONTROLPLANE_S3_ACCESS_KEY = reach.s3_access_key
    settings.CONTROLPLANE_S3_SECRET_KEY = reach.s3_secret_key
    found = OffDisk(kind, root, store, join(root, "lake"))
    try:
        response = api.post(
            "/api/connections/",
            {"name": "lake", "kind": "files", "settings": {"root": found.lake}},
            format="json",
        )
        assert response.status_code == 201, response.json()
        if spark is None:
            yield found
            return
        with client_settings(spark, checkpoints.for_driver()):
            yield found
    finally:
        # A failed test's drivers would go on writing under the root being removed.
        for run in Run.objects.filter(state__in=RunState.active()):
            launcher.kill(run)
        if kind == "hdfs":  # HDFS deletes no directory that has snapshots
            for entry in store.list(checkpoint_root):
                for snapshot in store.snapshots(entry.path):
                    store.delete_snapshot(entry.path, snapshot)
        store.remove_tree(root)


@contextlib.contextmanager
def client_settings(spark, storage: dict) -> Iterator[None]:
    """The shared Spark session's Hadoop configuration with the HDFS and S3A client settings
    a driver is given for `storage` (its `spark.hadoop.*`), put back as they were after."""
    conf = spark._jsc.hadoopConfiguration()
    given = {
        key.removeprefix("spark.hadoop."): value
        for key, value in hadoop.session_conf(storage).items()
        if key.startswith("spark.hadoop.")
    }
    saved = {key: conf.get(key) for key in given}
    for key, value in given.items():
        conf.set(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                conf.unset(key)
            else:
                conf.set(key, value)


def hidden(name: str) -> bool:
    """What readers of a table's directory leave out (Spark, pyarrow, Hive)."""
    return name.startswith(("_", "."))


def finished_files(store: Storage, base: str) -> list[str]:
    """The finished files under a files sink's directory, relative to it, listed through
    jobs.storage (hidden directories, where the sink keeps everything else, not entered)."""

    def visible(uri: str, prefix: str) -> Iterator[str]:
        for entry in store.list(uri):
            if hidden(entry.name):
                continue
            if entry.is_dir:
                yield from visible(entry.path, f"{prefix}{entry.name}/")
            else:
                yield f"{prefix}{entry.name}"

    return sorted(visible(base, ""))


def manifest(store: Storage, base: str) -> list[dict]:
    """The files sink's manifest entries (one per finished file), through jobs.storage."""
    folder = join(base, files.MANIFEST)
    return [
        json.loads(store.read_text(entry.path))
        for entry in store.list(folder)
        if entry.name.endswith(".json") and not hidden(entry.name)
    ]


def rolling(store: Storage, base: str) -> bool:
    """Whether a roll of staged rows into a finished file is under way (its plan exists)."""
    return any(
        entry.name.endswith(".json") and entry.name[0].isdigit()
        for entry in store.list(join(base, files.STAGING, files.PLANS))
    )


def staged_rows(store: Storage, base: str) -> bool:
    """Whether rows wait in the files sink's staging (batches staged, not yet rolled): a
    data file in a batch's directory (<query>/<batch>/_attempts/<attempt>/...), at any
    depth."""

    def data(uri: str) -> bool:
        for entry in store.list(uri):
            if hidden(entry.name) and entry.name != files.ATTEMPTS:
                continue
            if not entry.is_dir or data(entry.path):
                return True
        return False

    for query in store.list(join(base, files.STAGING)):
        if query.is_dir and not hidden(query.name):
            batches = store.list(query.path)
            if any(b.is_dir and b.name.isdigit() and data(b.path) for b in batches):
                return True
    return False


def json_ids(store: Storage, base: str, names: list[str]) -> list[str]:
    """The `id`s of finished JSON-lines files, each read whole through jobs.storage and
    parsed by pyarrow's JSON reader (a second reader besides Spark's)."""
    ids: list[str] = []
    for name in names:
        data = store.read_bytes(join(base, name))
        table = pj.read_json(io.BytesIO(data), pj.ReadOptions(use_threads=False))
        ids += table["id"].to_pylist()
    return ids
