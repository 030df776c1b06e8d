"""The audit log of shared Spark applications: who created, changed, started, stopped,
recycled or deleted one, when, why, and its definition and state before and after.

An entry has `application_name` set and `pipeline_name` and `connection_name` empty; it is
written in the same transaction as the change it records.
"""

from __future__ import annotations

from .audit import actor
from .models import AuditEntry, SparkApplication

# What an operator defines (takes effect at the application's next start) ...
DEFINITION = ("description", "master", "driver_memory", "executor_memory", "conf", "capacity")
# ... and what is desired and observed of it around the change.
STATE = ("desired_state", "status", "generation")


def snapshot(app: SparkApplication | None) -> dict:
    """Its definition and state (nothing secret: a conf holds allow-listed settings only)."""
    if app is None:
        return {}
    out = {name: getattr(app, name) for name in DEFINITION + STATE}
    out["conf"] = dict(out["conf"] or {})
    return out


def record(
    name: str, action: str, *, user, before: dict, after: dict, reason: str = ""
) -> AuditEntry:
    """Write an entry for application `name` (inside the transaction that made the change);
    `action` is e.g. `application-create`, `application-stop`."""
    return AuditEntry.objects.create(
        **actor(user),
        action=action,
        application_name=name,
        reason=reason,
        before=before,
        after=after,
    )
