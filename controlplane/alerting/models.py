"""Alerting: channels (where alerts go), rules (when they fire), alerts (one per rule and
subject while its condition holds) and deliveries (every attempt to send one, recorded)."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.connections.models import NAME_VALIDATOR
from controlplane.crypto import decrypt_json, encrypt_json
from controlplane.definitions.models import Pipeline


class ChannelKind(models.TextChoices):
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook (JSON, HMAC-signed)"
    SLACK = "slack", "Slack-compatible webhook"


class AlertChannel(models.Model):
    """Where alerts are sent. Defined by admins; a webhook's signing key is stored encrypted
    and never shown."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    # E-mail: addresses, comma-separated; webhooks: the URL.
    target = models.CharField(max_length=2000)
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:  # never the key, even in a traceback
        return f"<AlertChannel {self.name} ({self.kind})>"

    def get_signing_key(self) -> str:
        return (
            decrypt_json(self.secret_encrypted).get("signing_key", "")
            if self.secret_encrypted
            else ""
        )

    def set_signing_key(self, key: str) -> None:
        self.secret_encrypted = encrypt_json({"signing_key": key}) if key else ""


class AlertRule(models.Model):
    """When to alert: a kind (controlplane.alerting.rules.KINDS) with its parameters, for one
    pipeline or every pipeline; how long the condition must hold before it fires (`for`),
    how often it repeats while it holds, and where it goes."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=32)
    params = models.JSONField(default=dict, blank=True)
    # None: every pipeline.
    pipeline = models.ForeignKey(
        Pipeline, null=True, blank=True, on_delete=models.CASCADE, related_name="alert_rules"
    )
    # "name:value": only pipelines carrying that label (with `pipeline` empty).
    label = models.CharField(max_length=130, blank=True, default="")
    for_seconds = models.PositiveIntegerField(default=0)
    repeat_seconds = models.PositiveIntegerField(default=1800, help_text="0: never repeat.")
    channels = models.ManyToManyField(AlertChannel, related_name="rules", blank=True)
    enabled = models.BooleanField(default=True)
    silenced_until = models.DateTimeField(null=True, blank=True)
    silence_reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class AlertState(models.TextChoices):
    PENDING = "pending", "Pending"  # holds, not for long enough yet: nothing sent
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"
    DROPPED = "dropped", "Dropped"  # went away while pending: never sent

    @classmethod
    def open(cls) -> list[str]:
        return [cls.PENDING, cls.FIRING]


class Alert(models.Model):
    """One rule's alert for one subject (a pipeline, or the control plane), from the moment
    its condition held until it no longer does."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="alerts")
    pipeline = models.ForeignKey(
        Pipeline, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )
    subject = models.CharField(max_length=63)
    state = models.CharField(max_length=16, choices=AlertState.choices)
    message = models.TextField()
    since = models.DateTimeField(help_text="The condition has held since.")
    fired_at = models.DateTimeField(null=True, blank=True)
    notified_at = models.DateTimeField(null=True, blank=True)
    repeats = models.PositiveIntegerField(default=0)
    resolved_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-since", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "subject"],
                condition=models.Q(state__in=["pending", "firing"]),
                name="one_open_alert_per_rule_and_subject",
            )
        ]

    def __str__(self) -> str:
        return f"{self.rule.name} on {self.subject} ({self.state})"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # to be sent (again) at next_try_at
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"  # gave up after the last attempt


class AlertDelivery(models.Model):
    """One message (firing, repeat or resolved) of an alert to one channel, with every
    attempt's outcome. Written with the alert's change (an outbox); sent by a beat task."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16)  # firing, repeat, resolved
    message = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["outcome", "next_try_at"])]

    def __str__(self) -> str:
        return f"{self.event} of {self.alert} to {self.channel}"
