"""Whether a new spec version is a bad deploy, to be rolled back automatically (the Flink
Kubernetes operator's rollback to the last stable spec). Pure: no Django, no Celery; time
is passed in.

A version is healthy once one of its runs has committed a batch. Until then it is a bad
deploy when its restart policy gave up, when it failed FAILURES times, or when its run has
been running for N minutes without committing anything while the oldest record waiting
for it is at least N minutes old (a quiet topic is not a bad deploy: with nothing to read
there is no batch to commit; nor is a pipeline that was stopped)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

FAILURES = 3


@dataclass(frozen=True)
class VersionFacts:
    version: int
    started: bool  # one of its runs has started
    committed: bool  # one of its runs committed a batch
    failures: int  # failures of its runs
    gave_up: bool  # the restart policy gave up on it
    running_since: datetime | None  # when its run running now started (None: none runs)
    waiting_seconds: float | None  # age of the oldest record not yet read (None: unknown)


def verdict(facts: VersionFacts, minutes: float, now: datetime) -> str | None:
    """Why version `facts.version` is to be rolled back, or None."""
    if facts.committed or not facts.started:
        return None
    v = facts.version
    if facts.gave_up:
        return f"version {v} failed until its restart policy gave up, without committing a batch"
    if facts.failures >= FAILURES:
        return f"version {v} failed {facts.failures} times without committing a batch"
    limit = timedelta(minutes=minutes)
    running = facts.running_since
    waiting = facts.waiting_seconds
    if running is not None and now - running >= limit and (waiting or 0) >= limit.total_seconds():
        return (
            f"version {v} committed no batch in {minutes:g} min of running while records"
            f" waited (the oldest for {waiting / 60:.0f} min)"
        )
    return None
