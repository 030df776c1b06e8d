"""The one way tests wait on other processes: poll a condition until it holds or time runs out.

No test sleeps for a fixed time hoping something happened; it polls a condition here. The
interval is short by default; where each poll is itself costly (a reconcile tick, a Spark read,
an HTTP call to a separate stack) callers poll every 0.25-0.5 s instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _poll(
    predicate: Callable[[], T],
    timeout: float,
    every: float,
    ignore: tuple[type[BaseException], ...],
) -> tuple[T | None, BaseException | None]:
    """(the first truthy value of `predicate()`, None), or (None, the last error ignored) once
    `timeout` s have passed. Polled once more at the deadline, so that a slow poll that
    overran it still counts."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
        except ignore as exc:  # e.g. the service polled is down for now
            last_error = exc
        else:
            if value:
                return value, None
        left = deadline - time.monotonic()
        if left <= 0:
            return None, last_error
        time.sleep(min(every, left))


def wait_for(
    predicate: Callable[[], object], timeout: float = 10.0, *, every: float = 0.05
) -> bool:
    """True as soon as `predicate()` is true, False if it is still false after `timeout` s
    (for a caller that asserts with its own message, or reads on either way)."""
    value, _ = _poll(predicate, timeout, every, ())
    return bool(value)


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    *,
    every: float = 0.1,
    details: Callable[[], object] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `predicate()` every `every` s until it is truthy and return that value; after
    `timeout` s fail with "timed out after Ns waiting for <what>", then what `details()`
    says (the runs, a log tail: what a reader of the failure needs). Errors of the types in
    `ignore` count as "not yet" (the last one is named on a timeout); an error of `details()`
    itself is shown in its place, never raised over the timeout."""
    value, last_error = _poll(predicate, timeout, every, ignore)
    if value:
        return value
    message = f"timed out after {timeout:g}s waiting for {what}"
    if last_error is not None:
        message += f"\nlast error: {last_error!r}"
    if details is not None:
        try:
            message += f"\n{details()}"
        except Exception as exc:  # the diagnostics must not hide the timeout
            message += f"\n(details unavailable: {exc!r})"
    raise AssertionError(message)
