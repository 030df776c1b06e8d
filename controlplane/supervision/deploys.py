"""Whether a new spec version is a bad deploy, to be rolled back automatically (the Flink
Kubernetes operator's rollback to the last stable spec). Pure: no Django, no Celery; time
is passed in.

A version is healthy once one of its runs has committed a batch. Until then it is a bad
deploy when its restart policy gave up, when it failed FAILURES times, or when N minutes
after its first run started it has committed nothing although records were waiting (a
quiet topic is not a bad deploy: with nothing to read there is no batch to commit)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

FAILURES = 3


@dataclass(frozen=True)
class VersionFacts:
    version: int
    started_at: datetime | None  # when its first run started (None: not yet)
    committed: bool  # one of its runs committed a batch
    failures: int  # failures of its runs
    gave_up: bool  # the restart policy gave up on it
    waiting_records: int | None  # records in Kafka not yet committed (None: unknown)


def verdict(facts: VersionFacts, minutes: float, now: datetime) -> str | None:
    """Why version `facts.version` is to be rolled back, or None."""
    if facts.committed or facts.started_at is None:
        return None
    v = facts.version
    if facts.gave_up:
        return f"version {v} failed until its restart policy gave up, without committing a batch"
    if facts.failures >= FAILURES:
        return f"version {v} failed {facts.failures} times without committing a batch"
    waited = now - facts.started_at
    if waited >= timedelta(minutes=minutes) and (facts.waiting_records or 0) > 0:
        return (
            f"version {v} committed no batch within {minutes:g} min of its start"
            f" ({facts.waiting_records:,} records waiting)"
        )
    return None
