"""Which control-plane host takes the next driver process, and which hosts are lost.

Pure: no Django, no Celery; time is passed in. A host is lost once its worker has been silent
for longer than the timeout. The next driver goes to the live host with room that is least
loaded relative to its capacity (then the one with fewer drivers, then by name, so that a
decision is the same wherever it is taken).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class HostLoad:
    name: str
    capacity: int  # driver processes it takes
    used: int  # driver processes placed on it (dedicated runs, shared applications)
    seen_at: datetime | None  # when its worker last said it is alive


def lost(seen_at: datetime | None, now: datetime, timeout: timedelta) -> bool:
    return seen_at is None or now - seen_at > timeout


def choose(hosts: Iterable[HostLoad], now: datetime, timeout: timedelta) -> tuple[str | None, str]:
    """The host for the next driver, or None and why it has to wait."""
    alive = [h for h in hosts if not lost(h.seen_at, now, timeout)]
    if not alive:
        return None, "waiting: no control-plane host is alive"
    roomy = [h for h in alive if h.used < h.capacity]
    if not roomy:
        used = sum(h.used for h in alive)
        return None, (
            f"waiting: every control-plane host is full ({used} driver processes on "
            f"{len(alive)} host{'s' if len(alive) != 1 else ''})"
        )
    best = min(roomy, key=lambda h: (h.used / h.capacity, h.used, h.name))
    return best.name, ""
