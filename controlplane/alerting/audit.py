"""The audit log of alerting: who defined, changed, silenced or acknowledged what, and why.
Entries name the pipeline where there is one (`pipeline_name`), else none; the rule or
channel is in the entry's before/after."""

from __future__ import annotations

from controlplane.crypto import SecretsUnreadable
from controlplane.definitions.audit import actor
from controlplane.definitions.models import AuditEntry

from . import targets
from .models import Alert, AlertChannel, AlertRule


def rule_snapshot(rule: AlertRule | None) -> dict:
    if rule is None:
        return {}
    return {
        "rule": rule.name,
        "kind": rule.kind,
        "params": rule.params,
        "pipeline": rule.pipeline.name if rule.pipeline_id else None,
        "label": rule.label,
        "for_seconds": rule.for_seconds,
        "repeat_seconds": rule.repeat_seconds,
        "channels": sorted(c.name for c in rule.channels.all()) if rule.pk else [],
        "enabled": rule.enabled,
        "silenced_until": rule.silenced_until.isoformat() if rule.silenced_until else None,
    }


def channel_snapshot(channel: AlertChannel | None) -> dict:
    """Never the signing key: whether there is one. Never the URL's secret parts: the target
    masked, and `url_secrets` when it has any."""
    if channel is None:
        return {}
    snapshot = {
        "channel": channel.name,
        "kind": channel.kind,
        "target": channel.target,
        "signing_key": bool(channel.secret_encrypted),
    }
    if channel.url_encrypted:
        snapshot["url_secrets"] = True
    return snapshot


def secret_url(channel: AlertChannel) -> str | None:
    """The channel's full URL when parts of it are secret (None: none are, or it cannot be
    read), to tell whether a change replaced them: the masked target may read the same."""
    if not channel.url_encrypted:
        return None
    try:
        return channel.get_url()
    except SecretsUnreadable:
        return None


def channel_change(before_url: str | None, channel: AlertChannel) -> dict:
    """The `after` of a channel's change (`before_url`: its secret_url before): its
    snapshot, and `url_secrets_changed` when the URL's secret parts were replaced."""
    after = channel_snapshot(channel)
    now_url = secret_url(channel)
    parts = [
        targets.secret_parts(url, channel.kind) if url else None for url in (before_url, now_url)
    ]
    if parts[0] != parts[1]:
        after["url_secrets_changed"] = True
    return after


def alert_snapshot(alert: Alert) -> dict:
    return {
        "alert": alert.pk,
        "rule": alert.rule.name,
        "subject": alert.subject,
        "state": alert.state,
        "acknowledged": alert.acknowledged_at is not None,
    }


def record(action: str, *, user, before: dict, after: dict, pipeline=None, reason: str = ""):
    return AuditEntry.objects.create(
        **actor(user),
        action=action,
        pipeline=pipeline,
        pipeline_name=pipeline.name if pipeline is not None else "",
        reason=reason,
        before=before,
        after=after,
    )
