"""Health of the control plane's dependencies, answered within a second whatever they do.

A dependency that is down refuses connections at once; one that is paused (a stopped
process, a partitioned network) accepts them and never answers. Each check therefore runs in
a background thread and is given a deadline. Callers share the check in flight instead of
starting another thread that would hang the same way, so a stuck dependency costs one
thread, not one per request.

`database_answering()` is the same check, remembered for a second: the web app refuses
requests at once (503) while the database does not answer, instead of letting each one hang;
a check that is merely slow (a busy machine) refuses nothing until it has run for 5 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import psycopg
from django.db import connection

DEADLINE_SECONDS = 0.8
# How long the database's check may run before the web app takes the database for hung.
HUNG_SECONDS = 5.0


class _Probe:
    def __init__(self, name: str, check: Callable[[], None]) -> None:
        self.name = name
        self.check = check
        self.lock = threading.Lock()
        self.inflight: Future | None = None
        self.started = 0.0  # time.monotonic() of the check in flight's start
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"health-{name}")

    def start(self) -> Future:
        """The check in flight, or a new one."""
        with self.lock:
            if self.inflight is None or self.inflight.done():
                self.inflight = self.executor.submit(self.check)
                self.started = time.monotonic()
            return self.inflight

    def running_for(self) -> float:
        """How long the check in flight has been running (0 when none is)."""
        with self.lock:
            if self.inflight is None or self.inflight.done():
                return 0.0
            return time.monotonic() - self.started

    @staticmethod
    def outcome(future: Future, timeout: float) -> str:
        try:
            future.result(timeout=max(0.0, timeout))
        except FutureTimeout:
            return "not answering"
        except Exception as exc:
            return f"unreachable: {type(exc).__name__}"
        return "ok"


def _database_params() -> dict:
    params = connection.get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold", "options"):
        params.pop(name, None)
    params["connect_timeout"] = 2
    return params


def _database() -> None:
    with psycopg.connect(**_database_params(), autocommit=True) as conn:
        conn.execute("SELECT 1")


def _broker() -> None:
    from controlplane.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=0, timeout=2)
        conn.default_channel.client.ping()


_PROBES = {"database": _Probe("database", _database), "broker": _Probe("broker", _broker)}


def check(deadline: float = DEADLINE_SECONDS) -> dict[str, str]:
    """Each dependency's state ("ok", or what is wrong), all within about `deadline`."""
    started = time.monotonic()
    running = {name: probe.start() for name, probe in _PROBES.items()}
    return {
        name: _Probe.outcome(future, deadline - (time.monotonic() - started))
        for name, future in running.items()
    }


_remembered = {"at": float("-inf"), "ok": True}
_remembered_lock = threading.Lock()


def database_answering(max_age: float = 1.0, deadline: float = 0.5) -> bool:
    """Whether the database answers: as found by a check in the last `max_age` seconds, or
    by checking again for at most `deadline` seconds. A check that takes longer is not yet a
    database down: a machine whose CPUs are saturated can take seconds to connect, and
    refusing every request then would take the control plane down with it. Until the check
    in flight has run for HUNG_SECONDS, the last answer stands."""
    now = time.monotonic()
    with _remembered_lock:
        if now - _remembered["at"] < max_age:
            return _remembered["ok"]
    probe = _PROBES["database"]
    outcome = _Probe.outcome(probe.start(), deadline)
    if outcome == "not answering" and probe.running_for() < HUNG_SECONDS:
        with _remembered_lock:
            return _remembered["ok"]
    ok = outcome == "ok"
    with _remembered_lock:
        _remembered.update(at=time.monotonic(), ok=ok)
    return ok


def forget() -> None:
    """Drop the remembered answer (tests)."""
    with _remembered_lock:
        _remembered.update(at=float("-inf"), ok=True)
