"""Postgres from a job: which errors are the database being away, and waiting them out.

The Postgres sink and the Postgres dead-letter table of other sinks (jobs.dead_letters) both
write idempotently, so an operation interrupted by a restart, a failover or an unreachable
server is simply run again, with backoff, for up to `retry_seconds`; what waiting cannot fix
(bad credentials, a missing database or table) fails at once. Spark-free and Django-free."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

log = logging.getLogger("jobs.pg")

T = TypeVar("T")

# SQLSTATEs after which trying again can succeed: the connection broke (class 08), the
# server is shutting down or starting up (57P01-57P03). Authentication and missing objects
# are not among them.
TRANSIENT_STATES = ("08", "57P01", "57P02", "57P03")
RETRY_SECONDS = 60.0
FIRST_DELAY, MAX_DELAY = 0.5, 5.0


def transient(exc: BaseException) -> bool:
    """Whether a database error is the database being away (worth waiting for)."""
    if not isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(TRANSIENT_STATES)


def retried(
    call: Callable[[], T],
    what: str,
    retry_seconds: float = RETRY_SECONDS,
    sleep: Callable[[float], Any] = time.sleep,
) -> T:
    """`call()`, run again (with backoff) while the database is away, until `retry_seconds`
    have passed; any other error, or the last transient one, raised."""
    deadline = time.monotonic() + retry_seconds
    delay = FIRST_DELAY
    while True:
        try:
            return call()
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s: the database is away, retrying in %.1f s: %s", what, delay, exc)
            sleep(delay)
            delay = min(delay * 2, MAX_DELAY)


def connect(conninfo: dict[str, Any], pipeline: str) -> psycopg.Connection:
    """A new connection named after the pipeline (no waiting: see retried)."""
    return psycopg.connect(**{"application_name": f"cp:{pipeline}", **conninfo})
