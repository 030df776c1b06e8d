"""When the files sink rolls staged rows into a finished file: the rolling policy.

Plain Python, no Spark: the caller lists what is staged and passes the time in.

Each batch's rows are staged per partition directory (jobs.sinks.files). A partition's staged
files, oldest batch first, are rolled into one finished file when
- they reach the target size (a file is cut at the boundary between staged files closest to
  the target, before or after it: files are the target size give or take half a staged file,
  a batch's share of one partition),
- the oldest has waited `max_file_age_seconds` (Flink's rollover interval),
- no batch added to the partition for `inactivity_seconds` (Flink's inactivity interval),
- or the schema changed (a restart with another transform): files of one schema only are
  merged together, so the older schema's are rolled first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    target_bytes: int
    max_age_seconds: float
    inactivity_seconds: float

    @classmethod
    def of(cls, sink) -> Policy:
        return cls(
            target_bytes=sink.target_file_mb * 1024 * 1024,
            max_age_seconds=sink.max_file_age_seconds,
            inactivity_seconds=sink.inactivity_seconds,
        )


@dataclass(frozen=True)
class Staged:
    """One staged file: its batch (ordered: the query's generation, then its batch id), its
    path, size, when its batch was committed (epoch seconds) and the schema it has."""

    batch: tuple[int, int]
    path: str
    bytes: int
    committed_at: float
    schema: str


@dataclass(frozen=True)
class Roll:
    partition: str
    inputs: tuple[Staged, ...]
    reason: str  # "size", "age", "inactivity", "schema" or "flush"

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.inputs)


def plan(
    pending: Mapping[str, Sequence[Staged]], policy: Policy, now: float, *, flush: bool = False
) -> list[Roll]:
    """The rolls due at `now`, partition by partition (in partition order). `flush`: roll
    everything staged (e.g. for a pipeline being retired)."""
    rolls: list[Roll] = []
    for partition in sorted(pending):
        files = sorted(pending[partition], key=lambda s: (s.batch, s.path))
        runs = _by_schema(files)
        for i, run in enumerate(runs):
            last = i == len(runs) - 1
            forced = "flush" if flush else None if last else "schema"
            rolls.extend(_rolls(partition, run, policy, now, forced=forced))
    return rolls


def _by_schema(files: list[Staged]) -> list[list[Staged]]:
    runs: list[list[Staged]] = []
    for f in files:
        if runs and runs[-1][-1].schema == f.schema:
            runs[-1].append(f)
        else:
            runs.append([f])
    return runs


def _rolls(
    partition: str, files: list[Staged], policy: Policy, now: float, *, forced: str | None
) -> list[Roll]:
    rolls, current, size = [], [], 0
    for f in files:
        # Cut where the file comes closest to the target: without f, or with it.
        under, over = policy.target_bytes - size, size + f.bytes - policy.target_bytes
        if current and over >= 0 and under < over:
            rolls.append(Roll(partition, tuple(current), "size"))
            current, size = [], 0
        current.append(f)
        size += f.bytes
        if size >= policy.target_bytes:
            rolls.append(Roll(partition, tuple(current), "size"))
            current, size = [], 0
    if not current:
        return rolls
    reason = forced
    if reason is None and now - min(f.committed_at for f in current) >= policy.max_age_seconds:
        reason = "age"
    elif reason is None and now - max(f.committed_at for f in current) >= policy.inactivity_seconds:
        reason = "inactivity"
    if reason:
        rolls.append(Roll(partition, tuple(current), reason))
    return rolls


def next_check(pending: Mapping[str, Sequence[Staged]], policy: Policy, now: float) -> float | None:
    """When the next age or inactivity roll falls due (epoch seconds), or None when nothing
    is staged."""
    due = [
        min(
            min(f.committed_at for f in files) + policy.max_age_seconds,
            max(f.committed_at for f in files) + policy.inactivity_seconds,
        )
        for files in pending.values()
        if files
    ]
    return max(min(due), now) if due else None
