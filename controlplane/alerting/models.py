"""Alerting: channels (where alerts go), rules (when they fire), alerts (one per rule and
subject while its condition holds) and deliveries (every attempt to send one, recorded)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.connections.models import NAME_VALIDATOR
from controlplane.crypto import SecretsUnreadable, decrypt_json, encrypt_json
from controlplane.definitions.models import Pipeline
from controlplane.redaction import redact

from . import targets


class ChannelKind(models.TextChoices):
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "Webhook (JSON, HMAC-signed)"
    SLACK = "slack", "Slack-compatible webhook"


# Kinds sent by e-mail, their target a list of addresses; the others POST to a URL (kept
# encrypted, shown masked).
MAILED = frozenset({ChannelKind.EMAIL})


class AlertChannel(models.Model):
    """Where alerts are sent. Defined by admins; a webhook's signing key and the secret parts
    of its URL (user info, query values, a Slack-style path: controlplane.alerting.targets)
    are stored encrypted and never shown.

    `target` only ever holds what anyone may see: e-mail addresses, or the URL masked. Give
    a full URL by assigning it to `target` (or `set_url`): saving moves its secret parts into
    `url_encrypted`, whichever way the channel is written (API, admin, code)."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    # E-mail: addresses, comma-separated; webhooks: the URL, its secret parts masked.
    target = models.CharField(max_length=2000)
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    # The full URL when parts of it are secret (else empty: `target` is the URL).
    url_encrypted = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    # Columns holding crypto tokens: `manage.py rotate_secrets_key` re-encrypts them.
    ENCRYPTED_FIELDS = ("secret_encrypted", "url_encrypted")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:  # never the key, even in a traceback
        return f"<AlertChannel {self.name} ({self.kind})>"

    def save(self, *args, **kwargs) -> None:
        # The one place every write goes through: a full URL never reaches the table.
        if self.kind in MAILED:
            self.url_encrypted = ""
        elif not targets.has_placeholders(self.target):
            self.set_url(self.target)
        super().save(*args, **kwargs)

    def get_signing_key(self) -> str:
        return (
            decrypt_json(self.secret_encrypted).get("signing_key", "")
            if self.secret_encrypted
            else ""
        )

    def set_signing_key(self, key: str) -> None:
        self.secret_encrypted = encrypt_json({"signing_key": key}) if key else ""

    def get_url(self) -> str:
        """The URL to post to, secrets included (never to be shown: `target` is)."""
        return (
            decrypt_json(self.url_encrypted).get("url", "") if self.url_encrypted else self.target
        )

    def set_url(self, url: str) -> None:
        masked = targets.mask(url, self.kind)
        self.target = masked
        self.url_encrypted = encrypt_json({"url": url}) if masked != url else ""

    def scrub(self, text: str) -> str:
        """`text` (an error, a log line) without this channel's URL secrets in it."""
        if not text:
            return ""
        try:
            url = self.get_url() if self.url_encrypted else ""
        except SecretsUnreadable:
            url = ""  # then nothing was sent either: the error is about the key
        return targets.scrub(text, url, self.kind) if url else redact(text)


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
    SUPPRESSED = "suppressed", "Suppressed"  # over the channel's rate limit: never sent


class AlertDelivery(models.Model):
    """One message (firing, repeat or resolved) of an alert to one channel, with every
    attempt's outcome. Written with the alert's change (an outbox); sent by a beat task."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=16)  # firing, repeat, resolved
    message = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    # The evaluation round's time: what the channel's rate limit counts by.
    queued_at = models.DateTimeField(default=timezone.now)
    # Messages to the channel suppressed since the last one that went out (this one says so).
    suppressed_before = models.PositiveIntegerField(default=0)
    outcome = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_try_at = models.DateTimeField(db_index=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # Scrubbed of the channel's URL secrets before it is stored (requests quotes the URL).
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["outcome", "next_try_at"]),
            models.Index(fields=["channel", "queued_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.event} of {self.alert} to {self.channel}"
