"""Reading a Structured Streaming checkpoint directory: the truth about what a query has
committed, even while its driver is dead. Plain Python, no Spark, no Django.

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
import errno
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from jobs.kafka import readers
from jobs.kafka.offsets import flatten


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
    path: str | Path, *, history: int = 20, sizes: bool = True
) -> Checkpoint | None:
    """The checkpoint at `path`, or None if there is none (never started, or unreachable).
    Without `sizes`, its size on disk is not measured (a walk of every file: None)."""
    root = Path(path)
    if not (root / "offsets").is_dir():
        return None
    query_id = None
    with contextlib.suppress(OSError, ValueError):
        query_id = json.loads((root / "metadata").read_text()).get("id")
    planned = _batch_files(root / "offsets")
    committed = _batch_files(root / "commits")
    last_id = max(committed) if committed else None
    in_flight = sorted(n for n in planned if last_id is None or n > last_id)
    batches = []
    for n in sorted(planned, reverse=True)[:history]:
        batches.append(_batch(n, planned[n], committed.get(n)))
    pin = None
    with contextlib.suppress(OSError, ValueError, KeyError):
        pin = readers.read_pin(root)
    last = None
    if last_id is not None and last_id in planned:
        last = _batch(last_id, planned[last_id], committed[last_id])
    return Checkpoint(
        path=str(root),
        query_id=query_id,
        last_committed=last,
        in_flight=in_flight,
        history=batches,
        size_bytes=_size(root) if sizes else None,
        state_size_bytes=_size(root / "state") if sizes else None,
        reader=pin.reader if pin else None,
    )


def _batch_files(directory: Path) -> dict[int, Path]:
    if not directory.is_dir():
        return {}
    return {int(p.name): p for p in directory.iterdir() if p.name.isdigit()}


def planned_conf(root: str | Path) -> dict[str, str]:
    """The Spark settings the checkpoint's last batch was planned with (its offset log entry
    keeps those a restarted query must go on with: the state store provider, the shuffle
    partitions...); empty before the first batch."""
    batches = _batch_files(Path(root) / "offsets")
    if not batches:
        return {}
    try:
        lines = batches[max(batches)].read_text().splitlines()
        return dict(json.loads(lines[1]).get("conf") or {}) if len(lines) > 1 else {}
    except (OSError, ValueError, AttributeError):
        return {}


def _batch(n: int, offsets_file: Path, commit_file: Path | None) -> CheckpointBatch:
    offsets: dict = {}
    try:
        lines = offsets_file.read_text().splitlines()
        if len(lines) >= 3 and lines[2] not in ("-", ""):
            offsets = {k: v for k, v in json.loads(lines[2]).items() if not k.startswith("$")}
    except (OSError, ValueError):
        pass
    watermark = None
    if commit_file is not None:
        try:
            lines = commit_file.read_text().splitlines()
            watermark = json.loads(lines[1]).get("nextBatchWatermarkMs") if len(lines) > 1 else None
        except (OSError, ValueError):
            pass
    return CheckpointBatch(
        batch_id=n,
        planned_at=_mtime(offsets_file),
        committed_at=_mtime(commit_file) if commit_file is not None else None,
        offsets=offsets,
        watermark_ms=watermark,
    )


def _mtime(path: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(path.stat().st_mtime, tz=UTC)
    except OSError:
        return None


def _size(root: Path) -> int:
    return tree_size(root)[0]


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment else None


# --- Copies of a checkpoint (restore points) --------------------------------------------------
#
# Every file Spark writes into a checkpoint is written once, to a temporary name, then renamed
# into place (HDFSMetadataLog, the state stores' delta, snapshot and zip files), and never
# changed after. So a copy can share the files' data with hard links, and a copy taken while
# the query runs is consistent once it is cut back to the last batch committed before the copy
# began: the files of that batch and of every batch before it were all in place by then.


def copy_committed(source: str | Path, target: str | Path) -> Checkpoint | None:
    """Copy the checkpoint at `source` to `target` (which must not exist), as of its last
    committed batch: later batches' write-ahead entries and state versions are left out.
    Files are hard-linked where the file system allows, else copied. None, and nothing
    written, if `source` has no committed batch."""
    source, target = Path(source), Path(target)
    before = read_checkpoint(source, history=0, sizes=False)
    if before is None or before.last_committed is None:
        return None
    last = before.last_committed.batch_id
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        link_tree(source, partial)
        trim_after(partial, last)
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # never a half copy left behind
        raise
    return read_checkpoint(target, history=1)


def link_tree(source: Path, target: Path) -> None:
    """Copy the tree at `source` to `target` (created), hard-linking the files where the file
    system allows; temporary files are left out, files gone meanwhile are passed over."""
    target.mkdir(mode=0o700)
    # Files before directories, and RocksDB's shared SST files last: a snapshot (V.zip) that
    # appears while the tree is walked then finds the SST files it refers to.
    entries = sorted(
        os.scandir(source),
        key=lambda e: (e.is_dir(follow_symlinks=False), e.name == "SSTs", e.name),
    )
    for entry in entries:
        if entry.name.endswith((".tmp", ".tmp.crc")) or ".tmp." in entry.name:
            continue  # a file still being written
        if entry.is_dir(follow_symlinks=False):
            link_tree(Path(entry.path), target / entry.name)
        elif entry.is_file(follow_symlinks=False):
            try:
                _link(Path(entry.path), target / entry.name)
            except FileNotFoundError:
                continue  # cleaned up by the running query meanwhile (an old batch)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(source, target)


_LOG_ENTRY = re.compile(r"^\.?(\d+)(?:\.crc)?$")  # offsets/N, commits/N and their checksums
# A state store version's files: HDFS-backed `V.delta`, `V.snapshot`; RocksDB `V.zip`,
# `V_<id>.zip`, `V.changelog` (not its SST files, shared between versions).
_STATE_VERSION = re.compile(r"^\.?(\d+)(?:_[^.]*)?\.(?:delta|snapshot|zip|changelog)(?:\.crc)?$")


def trim_after(root: str | Path, last_batch: int) -> None:
    """Remove from the checkpoint at `root` everything written for batches after
    `last_batch`: `offsets/N` and `commits/N` (and their checksums) for N > last_batch, and
    state store versions above last_batch + 1 (version V holds the state after batch V - 1)."""
    root = Path(root)
    for log in ("offsets", "commits"):
        for path in _numbered(root / log, _LOG_ENTRY):
            if path[0] > last_batch:
                path[1].unlink(missing_ok=True)
    for path in _numbered(root / "state", _STATE_VERSION, recursive=True):
        if path[0] > last_batch + 1:
            path[1].unlink(missing_ok=True)


def _numbered(directory: Path, pattern: re.Pattern, *, recursive: bool = False):
    if not directory.is_dir():
        return
    for path in directory.rglob("*") if recursive else directory.iterdir():
        if path.is_file() and (match := pattern.match(path.name)):
            yield int(match.group(1)), path


def new_query_id(root: str | Path) -> str:
    """Give the checkpoint at `root` a new query id (what sinks scope their commit markers
    by): its batches after a restore are new batches, written again, never mistaken for the
    ones the old query wrote under the same numbers. Returns the id."""
    root = Path(root)
    query_id = str(uuid.uuid4())
    metadata = root / "metadata"
    temporary = root / ".metadata.restore.tmp"
    try:
        current = json.loads(metadata.read_text())
    except (OSError, ValueError):
        current = {}
    temporary.write_text(json.dumps({**current, "id": query_id}) + "\n")
    (root / ".metadata.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old content
    temporary.rename(metadata)
    return query_id


def tree_size(root: str | Path) -> tuple[int, int]:
    """Bytes and files under `root` (hard links counted at their full size)."""
    total = files = 0
    for path in Path(root).rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
                files += 1
        except OSError:
            continue
    return total, files
