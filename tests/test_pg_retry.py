"""jobs.pg: which Postgres errors are the database being away, and waiting them out (pure:
no database; the errors are psycopg's own classes, the sleep is recorded)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from jobs import pg


def test_an_away_database_is_waited_for_with_backoff_then_the_call_succeeds():
    slept: list[float] = []
    failures = [psycopg.OperationalError("connection refused"), errors.AdminShutdown("bye")]

    def call() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert pg.retried(call, "test", retry_seconds=60, sleep=slept.append) == "done"
    assert slept == [0.5, 1.0]


def test_what_waiting_cannot_fix_fails_at_once():
    slept: list[float] = []

    def call() -> None:
        raise errors.InvalidPassword("password authentication failed")

    with pytest.raises(errors.InvalidPassword):
        pg.retried(call, "test", retry_seconds=60, sleep=slept.append)
    assert slept == []
    assert not pg.transient(errors.UndefinedTable("no such table"))
    assert not pg.transient(ValueError("not a database error"))


def test_the_last_transient_error_is_raised_once_the_time_is_up():
    slept: list[float] = []

    def call() -> None:
        raise psycopg.OperationalError("connection refused")

    with pytest.raises(psycopg.OperationalError):
        pg.retried(call, "test", retry_seconds=0.1, sleep=slept.append)
    assert slept == []  # the first delay (0.5 s) would already pass the deadline
