"""Polling helpers for tests that wait on other processes."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 10.0) -> bool:
    """True as soon as `predicate()` is true, False if it is still false after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
