"""jobs/storage.py and jobs/checkpoints.py on each real store: the local disk, HDFS (WebHDFS)
and the S3-compatible server. The same checkpoint, laid out as Spark writes it, read, copied
as of its last commit, given a new query id, moved; HDFS snapshots; a store that does not
answer fails the call in bounded time, in words."""

from __future__ import annotations

import json
import socket

import pytest

from jobs import checkpoints
from jobs.kafka import readers
from jobs.storage import (
    HdfsStorage,
    S3Storage,
    StorageError,
    StorageSettings,
    join,
    scheme_of,
    storage_for,
)
from tests.stores import fake_checkpoint, names


def test_files_are_written_read_listed_and_removed(where):
    store = where.store
    assert store.list(where("missing")) == []
    assert not store.exists(where("missing"))
    with pytest.raises(FileNotFoundError):
        store.read_text(where("missing", "file"))
    store.write_text(where("a", "b", "one"), "first")
    store.write_text(where("a", "b", "one"), "second")  # replaced whole
    store.write_text(where("a", "two"), "2")
    assert store.read_text(where("a", "b", "one")) == "second"
    listed = store.list(where("a"))
    assert [(e.name, e.is_dir) for e in listed] == [("b", True), ("two", False)]
    assert listed[1].size == 1 and listed[1].mtime is not None
    assert store.is_dir(where("a", "b")) and not store.is_dir(where("a", "two"))
    assert names(store, where("a")) == {"b/one", "two"}
    assert store.tree_size(where("a")) == (7, 2)
    store.remove(where("a", "two"))
    store.remove(where("a", "two"))  # gone already: fine
    assert names(store, where("a")) == {"b/one"}
    store.remove_tree(where("a"))
    assert not store.exists(where("a", "b", "one"))
    store.remove_tree(where("a"))


def test_a_checkpoint_is_read_the_same_from_every_store(where):
    root = fake_checkpoint(where.store, where("orders"), committed=2)
    readers.write_pin(root, readers.Pin("spark-kafka", 4), where.store)
    found = checkpoints.read_checkpoint(root, store=where.store)
    assert found.query_id == "11111111-old"
    assert found.last_committed.batch_id == 2
    assert found.in_flight == [3]
    assert found.committed_offsets() == {("orders", 0): 30, ("orders", 1): 15}
    assert [b.batch_id for b in found.history] == [3, 2, 1, 0]
    assert found.last_committed.watermark_ms == 0
    assert found.last_committed.committed_at is not None
    assert found.reader == "spark-kafka"
    assert readers.read_pin(root, where.store) == readers.Pin("spark-kafka", 4)
    assert found.state_size_bytes == 4 * 4  # four versions of "rows"
    assert found.size_bytes > found.state_size_bytes
    assert checkpoints.source_start_offsets(root, where.store) == {("orders", 0): 0}
    assert readers.replay_pending(root, where.store)
    assert checkpoints.read_checkpoint(where("none"), store=where.store) is None


def test_a_copy_is_cut_back_to_the_last_commit_and_gets_a_new_query_id(where):
    store = where.store
    source = fake_checkpoint(store, where("live"), committed=1)
    copied = checkpoints.copy_committed(source, where("copy"), store=store)
    assert copied.last_committed.batch_id == 1 and copied.in_flight == []
    kept = names(store, where("copy"))
    assert {"offsets/1", "offsets/.1.crc", "commits/1", "state/0/0/2.delta"} <= kept
    assert "offsets/2" not in kept and "state/0/0/3.delta" not in kept
    assert not any(".tmp" in name for name in kept)
    assert "offsets/2" in names(store, source)  # the live checkpoint is untouched
    assert not any(".partial" in e.name for e in store.list(where()))
    new = checkpoints.new_query_id(where("copy"), store=store)
    assert json.loads(store.read_text(where("copy", "metadata"))) == {"id": new}
    assert not store.exists(where("copy", ".metadata.crc"))
    # Nothing committed: nothing copied.
    empty = fake_checkpoint(store, where("empty"), committed=-1)
    assert checkpoints.copy_committed(empty, where("copy2"), store=store) is None
    assert not store.exists(where("copy2"))


def test_a_tree_moves_whole_and_not_onto_another(where):
    store = where.store
    fake_checkpoint(store, where("live"), committed=0, in_flight=False)
    before = names(store, where("live"))
    store.move_tree(where("live"), where("kept", "one"))
    assert names(store, where("kept", "one")) == before
    assert not store.exists(where("live", "metadata"))
    store.write_text(where("other", "x"), "x")
    with pytest.raises(OSError):
        store.move_tree(where("other"), where("kept", "one"))
    assert names(store, where("kept", "one")) == before


def test_hdfs_snapshots_keep_what_the_query_deletes_after_them(tmp_path):
    from tests.stores import _where

    for where in _where("hdfs", tmp_path):
        store = where.store
        assert isinstance(store, HdfsStorage)
        root = fake_checkpoint(store, where("live"), committed=1)
        store.allow_snapshots(root)
        snapshot = store.create_snapshot(root, "rp1")
        store.remove(join(root, "offsets", "0"))  # as Spark's cleanup of old batches
        found = checkpoints.read_checkpoint(snapshot, store=store)
        assert found.last_committed.batch_id == 1
        assert "offsets/0" in names(store, snapshot)
        store.delete_snapshot(root, "rp1")
        store.delete_snapshot(root, "rp1")  # gone already: fine
        assert not store.exists(snapshot)


@pytest.mark.parametrize("kind", ["hdfs", "s3"])
def test_a_store_that_does_not_answer_fails_the_call_in_words(kind, silent_address):
    settings = (
        StorageSettings(hdfs_http=silent_address, hdfs_user="cp", timeout=0.5)
        if kind == "hdfs"
        else StorageSettings(
            s3_endpoint=f"http://{silent_address}",
            s3_access_key="k",
            s3_secret_key="s3cr3t-never-shown",
            timeout=0.5,
        )
    )
    root = "hdfs://nn:8020/cp" if kind == "hdfs" else "s3a://bucket/cp"
    store = storage_for(root, settings)
    with pytest.raises(StorageError) as caught:
        checkpoints.read_checkpoint(join(root, "orders"), store=store)
    message = str(caught.value)
    assert silent_address in message and "did not answer in time" in message
    assert "s3cr3t" not in message and "Traceback" not in message
    # Not asked again for a while: the next call fails at once, in the same words (a round
    # over many pipelines is not held up by one timeout each).
    with pytest.raises(StorageError, match="not asked again for") as again:
        store.exists(join(root, "other"))
    assert silent_address in str(again.value)


def test_a_store_that_is_down_fails_the_call_in_words():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    store = storage_for("hdfs://nn/", StorageSettings(hdfs_http=f"127.0.0.1:{port}"))
    with pytest.raises(StorageError, match="could not connect"):
        store.list("hdfs://nn/cp")


def test_locations_name_their_store():
    assert scheme_of("/var/cp") == "file"
    assert scheme_of("file:///var/cp") == "file"
    assert scheme_of("hdfs://nn:8020/cp") == "hdfs"
    assert scheme_of("s3a://bucket/cp") == "s3a"
    assert scheme_of("S3://bucket/cp") == "s3a"
    with pytest.raises(ValueError, match="local path, hdfs:// or s3a://"):
        scheme_of("gs://bucket/cp")
    s3 = storage_for("s3a://b/x", StorageSettings(s3_endpoint="http://h:1"))
    assert isinstance(s3, S3Storage)
    with pytest.raises(StorageError, match="CONTROLPLANE_HDFS_HTTP_ADDRESS"):
        storage_for("hdfs://nn/x", StorageSettings())


def test_settings_reach_a_driver_and_back_without_losing_the_keys():
    settings = StorageSettings(
        hdfs_http="nn:9870",
        hdfs_user="cp",
        s3_endpoint="http://s3:9000",
        s3_access_key="AK",
        s3_secret_key="SK",
        timeout=3.0,
    )
    given = settings.for_driver("s3a://b/cp")
    assert given["checkpoint_root"] == "s3a://b/cp"
    assert StorageSettings.from_driver_config(given) == settings
    assert "SK" not in repr(settings)  # never in a log line that prints the settings
