"""Reading a Structured Streaming checkpoint directory: the truth about what a query has
committed, even while its driver is dead. Plain Python, no Spark, no Django.

Every read and write goes through a jobs.storage.Storage: the checkpoint may be on the local
disk, HDFS or S3 (`store`; by default the one its location names, with default settings,
which serves local paths).

Layout (Spark 3.x/4.x): `metadata` holds the query id; `offsets/N` is the write-ahead log of
batch N (`v1`, the batch's metadata, then one line of offsets JSON per source), written
before the batch runs; `commits/N` is written once batch N is committed. So:

* the last committed batch is the highest N in `commits/`, its offsets in `offsets/N`;
* batches in flight are those in `offsets/` beyond the last commit;
* commit time is the commit file's time; offsets-to-commit time is how long the batch took
  from its WAL entry to its commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from jobs.kafka import readers
from jobs.kafka.offsets import PLAN, flatten
from jobs.kafka.offsets import record_stamps as _record_stamps
from jobs.storage import Entry, Storage, basename, join, parent, storage_for


@dataclass(frozen=True)
class CheckpointBatch:
    batch_id: int
    planned_at: datetime | None  # when its offsets (WAL entry) were written
    committed_at: datetime | None  # when it was committed; None: in flight
    offsets: dict  # the first source's offsets, `$` bookkeeping keys left out
    watermark_ms: int | None = None

    @property
    def wal_to_commit_ms(self) -> float | None:
        if self.planned_at is None or self.committed_at is None:
            return None
        return (self.committed_at - self.planned_at).total_seconds() * 1000

    def as_dict(self) -> dict:
        return {
            "batch_id": self.batch_id,
            "planned_at": _iso(self.planned_at),
            "committed_at": _iso(self.committed_at),
            "wal_to_commit_ms": self.wal_to_commit_ms,
            "offsets": self.offsets,
            "watermark_ms": self.watermark_ms,
        }


@dataclass(frozen=True)
class Checkpoint:
    path: str
    query_id: str | None
    last_committed: CheckpointBatch | None
    in_flight: list[int]
    history: list[CheckpointBatch] = field(default_factory=list)  # newest first
    size_bytes: int = 0
    state_size_bytes: int = 0
    reader: str | None = None  # the Kafka reader that started it (jobs.kafka.readers)

    def committed_offsets(self) -> dict[tuple[str, int], int]:
        if self.last_committed is None:
            return {}
        return flatten(self.last_committed.offsets)

    def as_dict(self) -> dict:
        last = self.last_committed
        return {
            "path": self.path,
            "query_id": self.query_id,
            "reader": self.reader,
            "last_batch_id": last.batch_id if last else None,
            "last_commit_at": _iso(last.committed_at) if last else None,
            "committed_offsets": last.offsets if last else {},
            "in_flight": self.in_flight,
            "size_bytes": self.size_bytes,
            "state_size_bytes": self.state_size_bytes,
            "history": [b.as_dict() for b in self.history],
        }


def read_checkpoint(
    path: str | os.PathLike,
    *,
    history: int = 20,
    sizes: bool = True,
    store: Storage | None = None,
) -> Checkpoint | None:
    """The checkpoint at `path`, or None if there is none (never started). Without `sizes`,
    its size is not measured (a walk of every file: None). A store that cannot be reached
    raises jobs.storage.StorageError."""
    root = os.fspath(path)
    store = store or storage_for(root)
    planned = _batch_files(store, join(root, "offsets"))
    if planned is None:
        return None
    query_id = None
    with contextlib.suppress(FileNotFoundError, ValueError, AttributeError):
        query_id = json.loads(store.read_text(join(root, "metadata"))).get("id")
    committed = _batch_files(store, join(root, "commits")) or {}
    last_id = max(committed) if committed else None
    in_flight = sorted(n for n in planned if last_id is None or n > last_id)
    batches = []
    for n in sorted(planned, reverse=True)[:history]:
        batches.append(_batch(store, n, planned[n], committed.get(n)))
    pin = None
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
        pin = readers.read_pin(root, store=store)
    last = None
    if last_id is not None and last_id in planned:
        last = _batch(store, last_id, planned[last_id], committed[last_id])
    size = state_size = None
    if sizes:
        # One walk for both (on HDFS or S3 each walk is a listing per directory).
        state = join(root, "state") + "/"
        size = state_size = 0
        for entry in store.walk(root):
            size += entry.size
            if entry.path.startswith(state):
                state_size += entry.size
    return Checkpoint(
        path=root,
        query_id=query_id,
        last_committed=last,
        in_flight=in_flight,
        history=batches,
        size_bytes=size,
        state_size_bytes=state_size,
        reader=pin.reader if pin else None,
    )


def _batch_files(store: Storage, directory: str) -> dict[int, Entry] | None:
    """Log entries by batch number; None if the directory does not exist."""
    entries = store.list(directory)
    if not entries and not store.is_dir(directory):
        return None
    return {int(e.name): e for e in entries if e.name.isdigit() and not e.is_dir}


def planned_conf(root: str | os.PathLike, store: Storage | None = None) -> dict[str, str]:
    """The Spark settings the checkpoint's last batch was planned with (its offset log entry
    keeps those a restarted query must go on with: the state store provider, the shuffle
    partitions...); empty before the first batch."""
    root = os.fspath(root)
    store = store or storage_for(root)
    batches = _batch_files(store, join(root, "offsets"))
    if not batches:
        return {}
    try:
        lines = store.read_text(batches[max(batches)].path).splitlines()
        return dict(json.loads(lines[1]).get("conf") or {}) if len(lines) > 1 else {}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


def has_state(root: str | os.PathLike, store: Storage | None = None) -> bool:
    """Whether the checkpoint keeps operator state (a stateful query has run on it)."""
    root = os.fspath(root)
    return (store or storage_for(root)).is_dir(join(root, "state"))


def source_start_offsets(root: str | os.PathLike, store: Storage | None = None) -> dict:
    """The offsets a query's Kafka source started from, as it wrote them into its checkpoint
    at its first start (Spark's connector: `sources/0/0`, a version line then JSON, after a
    zero byte kept for Spark 2.1), flattened; {} if there are none."""
    root = os.fspath(root)
    store = store or storage_for(root)
    try:
        data = store.read_bytes(join(root, "sources", "0", "0"))
        lines = data.lstrip(b"\x00").decode().splitlines()
        return flatten(json.loads(lines[1] if lines[0].startswith("v") else lines[0]))
    except (FileNotFoundError, ValueError, IndexError, AttributeError):
        return {}


def batch_position(root: str | os.PathLike, batch_id: int, store: Storage | None = None) -> int:
    """Where batch `batch_id` ends in its source, as one number that grows from batch to
    batch and is the same at every replay of it: the sum of its end offsets over the source's
    partitions (Spark writes them into the offset log before the batch runs, and a replay
    reads them back), plus its id (a batch with no new records, a stateful pipeline's
    watermark-only batch, still comes after the one before). Raises FileNotFoundError if the
    batch is not in the offset log, ValueError if its entry does not parse."""
    root = os.fspath(root)
    return _position(_end_offsets(store or storage_for(root), root, batch_id), batch_id)


def _position(offsets: dict, batch_id: int) -> int:
    """batch_position of an offset log entry already read."""
    total = 0
    for topic, partitions in offsets.items():
        if topic.startswith("$") or not isinstance(partitions, dict):
            continue  # the Python reader's bookkeeping
        total += sum(int(v) for v in partitions.values() if int(v) >= 0)
    return total + batch_id


def _end_offsets(store: Storage, root: str, batch_id: int) -> dict:
    """Batch `batch_id`'s entry in the offset log: its source's end offsets (JSON)."""
    lines = store.read_text(join(root, "offsets", str(batch_id))).splitlines()
    if len(lines) < 3 or lines[2] in ("-", ""):
        raise ValueError(f"offset log entry {batch_id} has no source offsets")
    return json.loads(lines[2])


def record_stamps(
    root: str | os.PathLike, batch_id: int, store: Storage | None = None
) -> dict[tuple[str, int], int] | None:
    """Per source partition of batch `batch_id`, what to add to a record's offset for a
    stamp of its own between the batch before's position and this one's (jobs.kafka.offsets.
    record_stamps), from the offset log: where the batch starts is where the one before ended
    (the first batch: where the query started, Spark's connector's `sources/0/0`; our reader's
    plan: partitions it began reading in this batch). None when that is not on record."""
    root = os.fspath(root)
    store = store or storage_for(root)
    try:
        ends = _end_offsets(store, root, batch_id)
        if batch_id == 0:
            start, previous = source_start_offsets(root, store), None
        else:
            before = _end_offsets(store, root, batch_id - 1)
            start, previous = flatten(before), _position(before, batch_id - 1)
        position = _position(ends, batch_id)
    except (FileNotFoundError, ValueError, AttributeError):
        return None
    plan = ends.get(PLAN)
    if isinstance(plan, dict) and isinstance(plan.get("from"), dict):
        start.update(flatten(plan["from"]))
    end = flatten(ends)
    if not end:
        return None
    return _record_stamps(start, end, position, previous)


def _batch(
    store: Storage, n: int, offsets_file: Entry, commit_file: Entry | None
) -> CheckpointBatch:
    offsets: dict = {}
    try:
        lines = store.read_text(offsets_file.path).splitlines()
        if len(lines) >= 3 and lines[2] not in ("-", ""):
            offsets = {k: v for k, v in json.loads(lines[2]).items() if not k.startswith("$")}
    except (FileNotFoundError, ValueError, AttributeError):
        pass
    watermark = None
    if commit_file is not None:
        try:
            lines = store.read_text(commit_file.path).splitlines()
            watermark = json.loads(lines[1]).get("nextBatchWatermarkMs") if len(lines) > 1 else None
        except (FileNotFoundError, ValueError, AttributeError):
            pass
    return CheckpointBatch(
        batch_id=n,
        planned_at=offsets_file.mtime,
        committed_at=commit_file.mtime if commit_file is not None else None,
        offsets=offsets,
        watermark_ms=watermark,
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


# --- Copies of a checkpoint (restore points) --------------------------------------------------
#
# Every file Spark writes into a checkpoint is written once, to a temporary name, then renamed
# into place (HDFSMetadataLog, the state stores' delta, snapshot and zip files; on S3 the
# no-rename checkpoint manager makes it visible by one PUT), and never changed after. So a
# copy can share the files' data (hard links on a local disk, server-side copies on S3, an
# HDFS snapshot), and a copy taken while the query runs is consistent once it is cut back to
# the last batch committed before the copy began: the files of that batch and of every batch
# before it were all in place by then.


def is_temporary(name: str) -> bool:
    """A file still being written (Hadoop's and Spark's temporary names)."""
    return name.endswith((".tmp", ".tmp.crc")) or ".tmp." in name


def copy_committed(
    source: str | os.PathLike, target: str | os.PathLike, store: Storage | None = None
) -> Checkpoint | None:
    """Copy the checkpoint at `source` to `target` (which must not exist), as of its last
    committed batch: later batches' write-ahead entries and state versions are left out.
    None, and nothing written, if `source` has no committed batch. Where the store renames
    (local, HDFS) the copy is made beside `target` and renamed into place; on S3 it is made
    in place (the caller records it only once this returns)."""
    source, target = os.fspath(source), os.fspath(target)
    store = store or storage_for(source)
    before = read_checkpoint(source, history=0, sizes=False, store=store)
    if before is None or before.last_committed is None:
        return None
    last = before.last_committed.batch_id
    renames = store.scheme != "s3a"
    partial = join(parent(target), f".{basename(target)}.partial") if renames else target
    store.remove_tree(partial)
    try:
        store.copy_tree(source, partial, skip=is_temporary)
        trim_after(partial, last, store=store)
        if renames:
            store.move_tree(partial, target)
    except BaseException:
        store.remove_tree(partial)  # never a half copy left behind
        raise
    return read_checkpoint(target, history=1, store=store)


_LOG_ENTRY = re.compile(r"^\.?(\d+)(?:\.crc)?$")  # offsets/N, commits/N and their checksums
# A state store version's files: HDFS-backed `V.delta`, `V.snapshot`; RocksDB `V.zip`,
# `V_<id>.zip`, `V.changelog` (not its SST files, shared between versions).
_STATE_VERSION = re.compile(r"^\.?(\d+)(?:_[^.]*)?\.(?:delta|snapshot|zip|changelog)(?:\.crc)?$")


def trim_after(root: str | os.PathLike, last_batch: int, store: Storage | None = None) -> None:
    """Remove from the checkpoint at `root` everything written for batches after
    `last_batch`: `offsets/N` and `commits/N` (and their checksums) for N > last_batch, and
    state store versions above last_batch + 1 (version V holds the state after batch V - 1)."""
    root = os.fspath(root)
    store = store or storage_for(root)
    for log in ("offsets", "commits"):
        for entry in store.list(join(root, log)):
            match = _LOG_ENTRY.match(entry.name)
            if match and not entry.is_dir and int(match.group(1)) > last_batch:
                store.remove(entry.path)
    for entry in store.walk(join(root, "state")):
        match = _STATE_VERSION.match(entry.name)
        if match and int(match.group(1)) > last_batch + 1:
            store.remove(entry.path)


def new_query_id(root: str | os.PathLike, store: Storage | None = None) -> str:
    """Give the checkpoint at `root` a new query id (what sinks scope their commit markers
    by): its batches after a restore are new batches, written again, never mistaken for the
    ones the old query wrote under the same numbers. Returns the id."""
    root = os.fspath(root)
    store = store or storage_for(root)
    query_id = str(uuid.uuid4())
    try:
        current = json.loads(store.read_text(join(root, "metadata")))
    except (FileNotFoundError, ValueError):
        current = {}
    store.remove(join(root, ".metadata.crc"))  # Hadoop's checksum of the old content
    store.write_text(join(root, "metadata"), json.dumps({**current, "id": query_id}) + "\n")
    return query_id


def tree_size(root: str | os.PathLike, store: Storage | None = None) -> tuple[int, int]:
    """Bytes and files under `root` (hard links counted at their full size)."""
    root = os.fspath(root)
    return (store or storage_for(root)).tree_size(root)
