"""The files sink: rows exactly once in finished files near a target size, whatever the
trigger interval.

Spark's own file sink writes at least one file per task per micro-batch: a day of 1-second
batches is hundreds of thousands of small files. Here a batch's rows are first *staged*, then
*rolled* into finished files by the rolling policy (jobs.sinks.rolling: size, age,
inactivity). Everything but the finished files lives in directories whose names start with
`_`, which Spark, pyarrow and Hive leave out of a table's files and partitions:

    <base>/<col>=<value>/.../part-<seq>.<ext>     finished files (what readers see)
    <base>/_cp_manifest/<seq>.json                 one per finished file: its path, size, rows
    <base>/_cp_staging/<query>/<batch>/...         a batch's rows, as Spark wrote them
    <base>/_cp_staging/<query>/_batches/<batch>.json   the batch's commit marker
    <base>/_cp_staging/_plans/<seq>.json           a roll being done (write-ahead)
    <base>/_cp_dead_letters/query=<query>/batch=<batch>/   records that did not parse (JSON)

In-progress -> pending -> finished: a batch being written is in progress (its staging
directory has no marker: a replay overwrites it); once its marker exists its files are
pending; a roll merges pending files into one finished file. Exactly once under kill -9 at
any point:
- a batch's staging is written with mode overwrite and its marker created after it: a
  replayed batch with a marker is skipped, one without is written again from scratch;
- a roll writes its plan (its inputs and the finished file's name) before anything else,
  merges into a hidden file, renames it into place (atomic on HDFS and local file systems;
  on S3, which has no rename, it writes the final name itself, which appears whole when its
  upload completes, and a re-run of the plan writes the same rows under it again),
  records it in the manifest, and only then deletes its inputs. A restart first finishes
  every plan left: a finished file already in place is kept, else it is merged again from the
  same inputs into the same name. So no row is lost (inputs outlive the plan) and none is
  written twice (one name per plan, and inputs leave the staging only after their file is
  recorded).

Merges copy without decoding (controlplane.spark.FileSink: JSON lines byte for byte, Avro and
Parquet blocks and row groups as they are); the driver does them on Hadoop's FileSystem, in a
thread of its own (Compactor), so batches go on while files roll.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ...failures import DefinitionError
from .model import DEAD_LETTERS_DIR
from .rolling import Policy, Roll, Staged, next_check, plan

log = logging.getLogger("jobs.sinks.files")

STAGING = "_cp_staging"
MANIFEST = "_cp_manifest"
DEAD_LETTERS = DEAD_LETTERS_DIR
BATCHES = "_batches"
PLANS = "_plans"
MERGING = "_merging"
# How a batch is staged: with our committer (Spark's options; see FilesStore.stage).
STAGING_COMMITTER = "controlplane.spark.StagingCommitter"
OUTPUT_COMMITTER = "spark.sql.sources.outputCommitterClass"
PARQUET_COMMITTER = "spark.sql.parquet.output.committer.class"
S3A_COMMITTER_FACTORY = "mapreduce.outputcommitter.factory.scheme.s3a"
FILE_COMMITTER_FACTORY = "org.apache.hadoop.mapreduce.lib.output.FileOutputCommitterFactory"
ATTEMPTS = "_attempts"  # a batch's task attempts' directories (StagingCommitter.ATTEMPTS)
EXTENSIONS = {"parquet": "parquet", "json": "json", "avro": "avro"}
# Markers of this many batches before the query's last are kept after their files rolled: a
# restart replays the last batch only (Spark keeps 100 in its own logs).
RETAIN_MARKERS = 100
# The rolling thread looks at least this often (and at once after each batch).
MAX_WAIT_SECONDS = 30.0
# Rolling that failed this many times in a row fails the run (the restart policy takes over).
MAX_FAILURES = 5


# One roll at a time per directory in this process (a stopped query's rolling thread may still
# be finishing a roll when its successor, or a test, starts one).
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()
# The rolling threads of each pipeline in this process, stopped and joined when it ends.
_ROLLERS: dict[str, list[Compactor]] = {}


def _lock_for(base: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(base, threading.Lock())


def stop_rollers(pipeline: str, timeout: float = 60.0) -> None:
    """Stops the pipeline's rolling threads and waits for a roll under way to end (a roll is
    short: a merge of one file), so that no roll of this run overlaps the next run's."""
    for roller in _ROLLERS.pop(pipeline, []):
        roller.stop()
        roller.thread.join(timeout)


class FileSinkError(DefinitionError):
    """A files sink whose definition cannot work (a partition column the output lacks): a
    definition error, not retried."""


def base_uri(root: str, path: str) -> str:
    return f"{root.rstrip('/')}/{path.strip('/')}"


def group_key(sink, schema_json: str) -> str:
    """What staged files must share to be merged into one file: the format, the partition
    columns and the schema they were written with (a restart may change any of them)."""
    digest = hashlib.sha1(schema_json.encode()).hexdigest()[:16]  # noqa: S324 - a name
    return f"{sink.format}|{','.join(sink.partition_by)}|{digest}"


def key_format(key: str) -> str:
    return key.split("|", 1)[0]


def check_columns(sink, columns: list[str]) -> None:
    """The partition columns must be output columns, and leave some to write."""
    names = {c.lower() for c in columns}
    for i, column in enumerate(sink.partition_by):
        if column.lower() not in names:
            raise FileSinkError(
                f"sink.partition_by[{i}]: column {column!r} is not in the pipeline's output "
                f"(columns: {', '.join(columns)})"
            )
    if sink.partition_by and len(sink.partition_by) >= len(names):
        raise FileSinkError("sink.partition_by: leaves no column to write in the files")


class FilesStore:
    """A files sink's directory, from the driver: staging batches, their markers, rolls."""

    def __init__(self, spark, base: str, sink, query: str):
        self.base = base.rstrip("/")
        self.sink = sink
        self.query = query.replace("-", "")[:12]
        self.policy = Policy.of(sink)
        self.jfs = spark._jvm.controlplane.spark.FileSink
        self._gateway = spark.sparkContext._gateway
        self._jstring = spark._jvm.String
        self.conf = spark._jsc.hadoopConfiguration()
        self.lock = _lock_for(self.base)
        self._markers: dict[tuple[str, int], dict[str, Any]] = {}
        # (query, batch) whose staging directories this driver deleted (their markers kept).
        self._cleared: set[tuple[str, int]] = set()
        self._seq: int | None = None
        # Finished file bytes / staged bytes of the last rolls (Parquet's merged file drops
        # the inputs' footers): the target the planner cuts at is scaled by it, so finished
        # files come out near the target rather than a few percent under.
        self.ratio = 1.0

    def path(self, *parts: Any) -> str:
        return "/".join([self.base, *(str(p) for p in parts)])

    def _batch_dir(self, batch_id: int) -> str:
        return self.path(STAGING, self.query, batch_id)

    def _marker(self, batch_id: int, query: str | None = None) -> str:
        return self.path(STAGING, query or self.query, BATCHES, f"{batch_id}.json")

    # -- the batch writer's side --------------------------------------------------------

    def committed(self, batch_id: int) -> bool:
        return bool(self.jfs.exists(self._marker(batch_id), self.conf))

    def stage(self, frame, batch_id: int) -> None:
        """Writes the batch's rows into its staging directory (whatever a killed attempt
        left there is replaced)."""
        writer = (
            frame.write.mode("overwrite")
            .format(self.sink.format)
            # Nothing renamed (a rename is a copy on S3): each task attempt writes under its
            # own directory and a committed one leaves a record; the batch's files are the
            # committed attempts' (controlplane.spark.StagingCommitter, FileSink.listFiles).
            .option(OUTPUT_COMMITTER, STAGING_COMMITTER)
            .option(PARQUET_COMMITTER, STAGING_COMMITTER)
            # The committer Spark asks the format for first, and replaces with ours: on S3
            # S3A's factory would warn at every batch that a FileOutputCommitter is slow.
            .option(S3A_COMMITTER_FACTORY, FILE_COMMITTER_FACTORY)
        )
        if self.sink.format == "json":
            writer = writer.option("compression", "none")  # merged byte for byte
        if self.sink.partition_by:
            writer = writer.partitionBy(*self.sink.partition_by)
        writer.save(self._batch_dir(batch_id))

    def write_dead_letters(self, letters, batch_id: int) -> None:
        letters.write.mode("overwrite").json(
            self.path(DEAD_LETTERS, f"query={self.query}", f"batch={batch_id}")
        )

    def commit(self, batch_id: int, *, schema: str, dead_letters: int | None) -> None:
        """The batch's marker: from now on its staged files are pending, and a replay of
        the batch is skipped."""
        marker = {
            "batch": batch_id,
            "query": self.query,
            "committed_at": time.time(),
            "schema": schema,
            "dead_letters": dead_letters,
        }
        self.jfs.create(self._marker(batch_id), json.dumps(marker), self.conf)

    # -- rolling ------------------------------------------------------------------------

    def recover(self) -> None:
        """Finishes the rolls a killed driver left (before anything else is rolled) and
        deletes its half-merged files."""
        with self.lock:
            self.jfs.delete(self.path(STAGING, MERGING), True, self.conf)
            self._finish_plans()

    def roll(
        self, now: float, *, flush: bool = False, stop: Callable[[], bool] = lambda: False
    ) -> float | None:
        """Rolls whatever the policy says is due at `now` (everything with `flush`); returns
        when the next roll falls due (None: nothing staged)."""
        with self.lock:
            self._finish_plans()
            # One listing of the queries and their markers per roll, for pending and prune.
            markers = {query: self._read_markers(query) for query in self._queries()}
            pending = self.pending(markers)
            policy = dataclasses.replace(
                self.policy, target_bytes=round(self.policy.target_bytes / self.ratio)
            )
            for roll in plan(pending, policy, now, flush=flush):
                if stop():
                    return None
                size = self._finish(self._write_plan(roll))
                if size and roll.bytes and roll.reason == "size":
                    measured = min(1.5, max(0.5, size / roll.bytes))
                    self.ratio = 0.5 * self.ratio + 0.5 * measured
                for staged in roll.inputs:
                    pending[roll.partition].remove(staged)
            self._prune(markers, {_owner(s.path) for files in pending.values() for s in files})
            return next_check(pending, self.policy, now)

    def pending(
        self, markers: dict[str, dict[int, dict[str, Any]]] | None = None
    ) -> dict[str, list[Staged]]:
        """Every committed batch's staged files, by partition directory ("" for none);
        `markers`: each query's markers, when just read."""
        if markers is None:
            markers = {query: self._read_markers(query) for query in self._queries()}
        out: dict[str, list[Staged]] = {}
        for query, found in markers.items():
            if not found:
                continue
            for line in self.jfs.listFiles(self.path(STAGING, query), self.conf):
                relative, size, where = line.split("\t")
                batch, _, rest = relative.partition("/")
                if not batch.isdigit() or int(batch) not in found:
                    continue  # a batch being written (or killed before its marker)
                marker = found[int(batch)]
                partition = rest.rpartition("/")[0]
                out.setdefault(partition, []).append(
                    Staged(
                        # Across queries (a checkpoint started anew), by commit time.
                        batch=(round(marker["committed_at"] * 1000), int(batch)),
                        path=f"{STAGING}/{query}/{where}",
                        bytes=int(size),
                        committed_at=marker["committed_at"],
                        schema=marker["schema"],
                    )
                )
        return out

    def _queries(self) -> list[str]:
        return sorted(
            name
            for name in self.jfs.children(self.path(STAGING), self.conf)
            if not name.startswith(("_", "."))
        )

    def _read_markers(self, query: str) -> dict[int, dict[str, Any]]:
        found = {}
        for name in self.jfs.children(self.path(STAGING, query, BATCHES), self.conf):
            if not name.endswith(".json") or name.startswith("."):
                continue
            batch = int(name.removesuffix(".json"))
            key = (query, batch)
            if key not in self._markers:
                text = self.jfs.read(self._marker(batch, query), self.conf)
                if text is None:
                    continue
                self._markers[key] = json.loads(text)
            found[batch] = self._markers[key]
        return found

    def _next_seq(self) -> int:
        if self._seq is None:
            seqs = [
                int(name.split(".", 1)[0])
                for folder in (self.path(STAGING, PLANS), self.path(MANIFEST))
                for name in self.jfs.children(folder, self.conf)
                if name[:1].isdigit()
            ]
            self._seq = max(seqs, default=0)
        self._seq += 1
        return self._seq

    def _write_plan(self, roll: Roll) -> dict[str, Any]:
        for _ in range(3):
            planned = self._plan_for(roll, self._next_seq())
            name = self.path(STAGING, PLANS, f"{planned['seq']:08d}.json")
            if self.jfs.create(name, json.dumps(planned), self.conf):
                return planned
            self._seq = None  # taken: by another roller of this directory; look again
        raise RuntimeError(f"{self.base}: roll sequence numbers keep being taken")

    def _plan_for(self, roll: Roll, seq: int) -> dict[str, Any]:
        fmt = key_format(roll.inputs[0].schema)
        name = f"part-{seq:08d}.{EXTENSIONS[fmt]}"
        return {
            "seq": seq,
            "partition": roll.partition,
            "output": f"{roll.partition}/{name}" if roll.partition else name,
            "inputs": [s.path for s in roll.inputs],
            "batches": [list(roll.inputs[0].batch), list(roll.inputs[-1].batch)],
            "reason": roll.reason,
            "format": fmt,
        }

    def _finish_plans(self) -> None:
        names = sorted(
            n for n in self.jfs.children(self.path(STAGING, PLANS), self.conf) if n[:1].isdigit()
        )
        for name in names:
            text = self.jfs.read(self.path(STAGING, PLANS, name), self.conf)
            if text is not None:
                log.info("finishing the roll %s a stopped driver left", name)
                self._finish(json.loads(text))

    def _finish(self, planned: dict[str, Any]) -> int | None:
        """Does a planned roll, or what is left of it: merge into the planned name unless the
        file is there, record it in the manifest, delete the inputs, then the plan. Returns
        the finished file's bytes when this call merged it."""
        seq, fmt = planned["seq"], planned["format"]
        started = time.monotonic()
        entry_path = self.path(MANIFEST, f"{seq:08d}.json")
        merged = None
        if not self.jfs.exists(entry_path, self.conf):
            final = self.path(planned["output"])
            if self.jfs.exists(final, self.conf):  # renamed before the driver died
                size = int(self.jfs.length(final, self.conf))
                rows = int(self.jfs.rows(fmt, final, self.conf))
            else:
                merging = self.path(
                    STAGING, MERGING, f"{seq:08d}-{uuid.uuid4().hex[:8]}.{EXTENSIONS[fmt]}"
                )
                inputs = [self.path(p) for p in planned["inputs"]]
                # On HDFS and local disks: merged into `merging`, renamed into place; on S3
                # (no rename there, only copies): written under the final name, which
                # appears whole by its upload's completion (FileSink.mergeInto).
                size, rows = (
                    int(v)
                    for v in self.jfs.mergeInto(
                        fmt, self._strings(inputs), merging, final, self.conf
                    )
                )
                merged = size
            entry = {
                "seq": seq,
                "file": planned["output"],
                "partition": planned["partition"],
                "format": fmt,
                "bytes": size,
                "rows": rows,
                "inputs": len(planned["inputs"]),
                "batches": planned["batches"],
                "reason": planned["reason"],
                "finished_at": time.time(),
            }
            self.jfs.create(entry_path, json.dumps(entry), self.conf)
            log.info(
                "rolled %s staged files into %s (%s bytes, %s rows, %s) in %.2f s",
                len(planned["inputs"]),
                planned["output"],
                size,
                rows,
                planned["reason"],
                time.monotonic() - started,
            )
        for p in planned["inputs"]:
            self.jfs.delete(self.path(p), False, self.conf)
        self.jfs.delete(self.path(STAGING, PLANS, f"{seq:08d}.json"), False, self.conf)
        return merged

    def _strings(self, values: list[str]):
        """A Java String[] (py4j hands Python lists over as java.util.List)."""
        array = self._gateway.new_array(self._jstring, len(values))
        for i, value in enumerate(values):
            array[i] = value
        return array

    def _prune(
        self, by_query: dict[str, dict[int, dict[str, Any]]], busy: set[tuple[str, int]]
    ) -> None:
        """Deletes the staging directories of batches that have nothing left to roll (once
        per driver) and their markers, but the current query's last RETAIN_MARKERS markers (a
        replay is checked against them); and the directories of other queries' batches that
        never committed."""
        for query, markers in by_query.items():
            last = max(markers, default=-1)
            for batch in sorted(markers):
                if (query, batch) in busy:
                    continue
                if (query, batch) not in self._cleared:
                    self.jfs.delete(self.path(STAGING, query, batch), True, self.conf)
                    self._cleared.add((query, batch))
                if query == self.query and batch > last - RETAIN_MARKERS:
                    continue
                self.jfs.delete(self._marker(batch, query), False, self.conf)
                self._markers.pop((query, batch), None)
                self._cleared.discard((query, batch))
            if query != self.query:
                for name in self.jfs.children(self.path(STAGING, query), self.conf):
                    if name.isdigit() and int(name) not in markers:
                        self.jfs.delete(self.path(STAGING, query, name), True, self.conf)


def _owner(path: str) -> tuple[str, int]:
    """(query, batch) of a staged file's path, _cp_staging/<query>/<batch>/..."""
    _, query, batch = path.split("/", 3)[:3]
    return query, int(batch)


def observed(observation) -> int | None:
    """The first metric of a pyspark Observation whose action has finished, or None when it
    was not reported (never blocks)."""
    future = observation._jo.future() if observation._jo is not None else None
    if future is None or not future.isCompleted():
        return None
    value = next(iter(observation.get.values()), None)
    return None if value is None else int(value)


class Compactor:
    """The thread that rolls a files sink's staged rows: first what a killed driver left
    (FilesStore.recover), then after each batch (poke) and when the next age or inactivity roll
    falls due. It ends when `alive()` says the pipeline's query no longer runs in this
    application, or when stopped (stop_rollers, as the pipeline's run ends: joined, so no
    roll of this run overlaps the next run's). Failures are retried with a backoff;
    MAX_FAILURES in a row fail the next batch (check)."""

    def __init__(
        self, sink: FilesStore, alive: Callable[[], bool], pipeline: str = "", clock=time.time
    ):
        self.sink = sink
        self.alive = alive
        self.clock = clock
        self.failures = 0
        self.error: BaseException | None = None
        self.wake = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._run, daemon=True, name=f"cp-files-roll-{sink.query}"
        )
        _ROLLERS.setdefault(pipeline, []).append(self)

    def start(self) -> Compactor:
        self.thread.start()
        return self

    def poke(self) -> None:
        self.wake.set()

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def check(self) -> None:
        """Raises when rolling has failed MAX_FAILURES times in a row, or its thread ended
        while the query runs."""
        if self.failures >= MAX_FAILURES:
            # Chained: the failure is classified by the type of what rolling met (a store
            # down or throttling, jobs.failures), not by this wrapper.
            raise RuntimeError(
                f"files sink {self.sink.base}: rolling staged files failed {self.failures} "
                f"times in a row: {self.error}"
            ) from self.error
        started, ended = self.thread.ident is not None, not self.thread.is_alive()
        if started and ended and not self.stopped.is_set():
            raise RuntimeError(f"files sink {self.sink.base}: its rolling thread ended")

    def _stopping(self) -> bool:
        try:
            return self.stopped.is_set() or not self.alive()
        except Exception:  # the application is going away
            return True

    def _run(self) -> None:
        recovered = False
        while not self._stopping():
            self.wake.clear()  # before rolling: a poke from now on means look again
            wait = MAX_WAIT_SECONDS
            try:
                if not recovered:
                    self.sink.recover()
                    recovered = True
                due = self.sink.roll(self.clock(), stop=self._stopping)
                self.failures, self.error = 0, None
                if due is not None:
                    wait = min(MAX_WAIT_SECONDS, max(0.2, due - self.clock() + 0.05))
            except Exception as exc:  # py4j errors too: retried, then surfaced by check()
                self.failures += 1
                self.error = exc
                wait = min(MAX_WAIT_SECONDS, 2.0 * self.failures)
                log.warning(
                    "rolling %s failed (%s in a row): %s", self.sink.base, self.failures, exc
                )
            self.wake.wait(wait)
