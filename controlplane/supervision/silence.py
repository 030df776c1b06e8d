"""When a running driver's silence means it is lost or stalled.

Pure logic (no Django, no Celery; time passed in): the reconciler judges a run with these,
and the tick's choice of which pipelines to visit (`controlplane.supervision.attention`)
uses the same rules, without the allowance for a control plane that was itself deaf (which
only ever spares a run: a pipeline it might spare is visited, and the visit decides).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

Deaf = Callable[[timedelta], bool]


def _never(window: timedelta) -> bool:
    return False


def heartbeat_overdue(
    *,
    started_at: datetime | None,
    last_heartbeat_at: datetime | None,
    now: datetime,
    timeout: timedelta,
    grace: timedelta,
    deaf: Deaf = _never,
) -> str | None:
    """Why the run counts as lost (no heartbeat in time), or None while it is heard from.
    `deaf(window)`: whether the control plane itself could not hear drivers within `window`."""
    if started_at is None:
        return None
    if last_heartbeat_at is not None:
        if now - last_heartbeat_at > timeout and not deaf(timeout):
            silent = (now - last_heartbeat_at).total_seconds()
            return f"no heartbeat for {silent:.0f} s (timeout {timeout.total_seconds():g} s)"
        return None
    if now - started_at > grace and not deaf(timeout):
        return f"no heartbeat within {grace.total_seconds():g} s of the launch"
    return None


def stall_window(stall_seconds: float, trigger_seconds: float) -> timedelta:
    """How long a running query may go without a batch or an idle report: the configured
    window, or 10 triggers if that is longer."""
    return timedelta(seconds=max(stall_seconds, 10 * trigger_seconds))


def stalled(
    *,
    started_at: datetime | None,
    last_batch_at: datetime | None,
    last_idle_at: datetime | None,
    now: datetime,
    window: timedelta,
    grace: timedelta,
    deaf: Deaf = _never,
) -> str | None:
    """Why the run counts as stalled (alive, but no batch completed and no idle report
    within `window`), or None."""
    if started_at is None:
        return None
    seen = [t for t in (last_batch_at, last_idle_at) if t is not None]
    if seen:
        quiet = now - max(seen)
        if quiet > window and not deaf(window):
            return (
                f"no batch completed for {quiet.total_seconds():.0f} s with records to read"
                f" (window {window.total_seconds():g} s)"
            )
        return None
    if now - started_at > grace + window and not deaf(window):
        return f"no batch completed within {(grace + window).total_seconds():g} s of the launch"
    return None
