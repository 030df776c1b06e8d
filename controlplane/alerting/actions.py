"""What operators do to alerts: acknowledge a firing one, silence a rule for a while (or end
the silence). Each under the row's lock, audited; the API and the pages call these."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from . import audit
from .models import Alert, AlertRule, AlertState


class NotFiring(Exception):
    """Only a firing alert is acknowledged (answered with 409)."""


def acknowledge(alert_id: int, *, user, reason: str, now: datetime) -> Alert:
    with transaction.atomic():
        alert = Alert.objects.select_for_update().select_related("rule").get(pk=alert_id)
        if alert.state != AlertState.FIRING:
            raise NotFiring(
                f"alert {alert.pk} is {alert.state}: only a firing alert is acknowledged"
            )
        if alert.acknowledged_at is None:
            before = audit.alert_snapshot(alert)
            alert.acknowledged_at, alert.acknowledged_by = now, user
            alert.save(update_fields=["acknowledged_at", "acknowledged_by"])
            audit.record(
                "alert-acknowledge", user=user, before=before,
                after=audit.alert_snapshot(alert), pipeline=alert.pipeline, reason=reason,
            )  # fmt: skip
    return alert


def silence(rule_id: int, until: datetime | None, *, user, reason: str) -> AlertRule:
    """Send nothing for the rule until `until` (None: end the silence now)."""
    with transaction.atomic():
        rule = AlertRule.objects.select_for_update().get(pk=rule_id)
        before = audit.rule_snapshot(rule)
        rule.silenced_until, rule.silence_reason = until, reason if until else ""
        rule.save(update_fields=["silenced_until", "silence_reason"])
        audit.record(
            "alert-rule-silence" if until else "alert-rule-unsilence", user=user,
            before=before, after=audit.rule_snapshot(rule), pipeline=rule.pipeline,
            reason=reason,
        )  # fmt: skip
    return rule
