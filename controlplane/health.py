"""Health of the control plane's dependencies, answered within a second whatever they do.

A dependency that is down refuses connections at once; one that is paused (a stopped
process, a partitioned network) accepts them and never answers. Each check therefore runs in
a background thread and is given a deadline; while one check is still stuck, the next caller
is told at once instead of starting another thread that would hang the same way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import psycopg
from django.db import connection

DEADLINE_SECONDS = 0.8


class _Probe:
    def __init__(self, name: str, check: Callable[[], None]) -> None:
        self.name = name
        self.check = check
        self.lock = threading.Lock()
        self.inflight = None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"health-{name}")

    def start(self):
        """A future for a new check, or a message if the last one is still stuck."""
        with self.lock:
            if self.inflight is not None and not self.inflight.done():
                return "not answering (an earlier check is still waiting)"
            self.inflight = self.executor.submit(self.check)
            return self.inflight


def _database() -> None:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("options", None)
    params["connect_timeout"] = 2
    with psycopg.connect(**params, autocommit=True) as conn:
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
    out = {}
    for name, future in running.items():
        if isinstance(future, str):
            out[name] = future
            continue
        try:
            future.result(timeout=max(0.0, deadline - (time.monotonic() - started)))
        except FutureTimeout:
            out[name] = f"not answering within {deadline:g} s"
        except Exception as exc:
            out[name] = f"unreachable: {type(exc).__name__}"
        else:
            out[name] = "ok"
    return out
