"""The audit log: who changed what about a pipeline, when, why, and the state around it."""

from __future__ import annotations

from datetime import datetime

from .models import AuditEntry, Pipeline

SNAPSHOT = (
    "desired_state",
    "status",
    "version",
    "generation",
    "attempt",
    "restarts",
    "next_attempt_at",
)


def snapshot(pipeline: Pipeline) -> dict:
    out = {}
    for name in SNAPSHOT:
        value = getattr(pipeline, name)
        out[name] = value.isoformat() if isinstance(value, datetime) else value
    return out


def actor(user) -> dict:
    """Who an entry names: the user (kept by name too), or `system` for none."""
    known = getattr(user, "pk", None)
    return {
        "actor": user if known else None,
        "actor_name": user.get_username() if known else "system",
    }


def record(pipeline: Pipeline, action: str, *, user, reason: str, before: dict) -> AuditEntry:
    """Write an entry (call it inside the transaction that made the change)."""
    return record_with(
        pipeline, action, user=user, reason=reason, before=before, after=snapshot(pipeline)
    )


def definition_snapshot(pipeline: Pipeline) -> dict:
    """What creating or changing a pipeline's definition is audited with: its snapshot and
    where its query runs (`placement`)."""
    return {
        **snapshot(pipeline),
        "placement": pipeline.placement,
        "labels": pipeline.labels,
        "restore_point_minutes": pipeline.restore_point_minutes,
        "auto_rollback_minutes": pipeline.auto_rollback_minutes,
    }


def record_with(
    pipeline: Pipeline, action: str, *, user, reason: str, before: dict, after: dict
) -> AuditEntry:
    """Like `record`, with the state after the change given (e.g. a definition snapshot)."""
    return AuditEntry.objects.create(
        **actor(user),
        action=action,
        pipeline=pipeline,
        pipeline_name=pipeline.name,
        reason=reason,
        before=before,
        after=after,
    )


def connection_snapshot(connection) -> dict:
    """What the audit log keeps of a connection: its settings and which secrets are set,
    never their values."""
    if connection is None:
        return {}
    return {
        "kind": connection.kind,
        "settings": connection.settings,
        "secret_fields": connection.secret_fields,
    }


def record_connection(
    name: str, action: str, *, user, before: dict, after: dict, reason: str = ""
) -> AuditEntry:
    """Write an entry for a connection change (inside the transaction that made it)."""
    return AuditEntry.objects.create(
        **actor(user),
        action=action,
        connection_name=name,
        reason=reason,
        before=before,
        after=after,
    )


def record_connection_saved(
    connection, *, user, before: dict, created: bool, dropped=(), reason: str = ""
) -> AuditEntry:
    """A connection was created or changed (API, pages or admin): `before` is its snapshot
    from before the change, `dropped` the stored secrets the change removed."""
    after = connection_snapshot(connection)
    if dropped:
        after["secrets_dropped"] = list(dropped)
    return record_connection(
        connection.name,
        "connection-create" if created else "connection-update",
        user=user,
        before=before,
        after=after,
        reason=reason,
    )
