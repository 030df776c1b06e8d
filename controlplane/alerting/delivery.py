"""Sending alerts: the deliveries the evaluation round wrote (an outbox), each to its
channel, by a beat task; every attempt's outcome recorded on the delivery. A failed attempt
is tried again later (BACKOFF), then given up (`failed`). Nothing here runs in the reconcile
tick, and a channel that hangs costs at most its timeout.

A webhook's URL may carry credentials (controlplane.alerting.targets): requests quotes the
URL in its exceptions and urllib3 in its log lines, so every error is scrubbed of the
channel's secret parts before it is stored or logged, and so is whatever requests and urllib3
log while a channel's URL is in use."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction

from .models import AlertDelivery, ChannelKind, DeliveryStatus

log = logging.getLogger("controlplane.alerting")

# Waits before the 2nd, 3rd... attempt; after the last, the delivery has failed.
BACKOFF_SECONDS = (10, 30, 60, 300, 900)
TIMEOUT = (3.0, 5.0)
BATCH = 50
SIGNATURE_HEADER = "X-Controlplane-Signature"
TIMESTAMP_HEADER = "X-Controlplane-Timestamp"


def deliver(now: datetime) -> dict:
    """Send what is due (at most BATCH); returns counts."""
    counts = {"sent": 0, "retry": 0, "failed": 0}
    with transaction.atomic():
        due = list(
            AlertDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("alert__rule", "alert__pipeline", "channel")
            .filter(outcome=DeliveryStatus.PENDING, next_try_at__lte=now)
            .order_by("next_try_at", "id")[:BATCH]
        )
        for delivery in due:
            delivery.attempts += 1
            try:
                send(delivery)
            except Exception as exc:  # every failure is the delivery's, recorded
                error = delivery.channel.scrub(f"{type(exc).__name__}: {exc}")
                delivery.last_error = error[:2000]
                if delivery.attempts > len(BACKOFF_SECONDS):
                    delivery.outcome = DeliveryStatus.FAILED
                    counts["failed"] += 1
                    log.warning("alert delivery %s failed for good: %s", delivery.pk, error)
                else:
                    wait = BACKOFF_SECONDS[delivery.attempts - 1]
                    delivery.next_try_at = now + timedelta(seconds=wait)
                    counts["retry"] += 1
            else:
                delivery.outcome = DeliveryStatus.SENT
                delivery.sent_at = now
                delivery.last_error = ""
                counts["sent"] += 1
            delivery.save(
                update_fields=["attempts", "outcome", "next_try_at", "sent_at", "last_error"]
            )
    return counts


def payload(delivery: AlertDelivery) -> dict:
    alert = delivery.alert
    rule = alert.rule
    base = settings.CONTROLPLANE_URL.rstrip("/")
    return {
        "event": delivery.event,  # firing, repeat, resolved
        "alert": alert.pk,
        "rule": rule.name,
        "kind": rule.kind,
        "subject": alert.subject,
        "pipeline": alert.pipeline.name if alert.pipeline_id else None,
        "message": delivery.message,
        "since": alert.since.isoformat(),
        "url": f"{base}/pipelines/{alert.subject}/" if alert.pipeline_id else f"{base}/",
        # Messages to this channel not sent (its rate limit) since the last one that was.
        "suppressed": delivery.suppressed_before,
    }


def title(delivery: AlertDelivery) -> str:
    word = {"firing": "FIRING", "repeat": "STILL FIRING", "resolved": "RESOLVED"}
    alert = delivery.alert
    return f"[{word.get(delivery.event, delivery.event)}] {alert.rule.name}: {alert.subject}"


def send(delivery: AlertDelivery) -> None:
    """Raises if the channel did not take it."""
    channel = delivery.channel
    _SENDERS[channel.kind](delivery, channel, payload(delivery))


def _mail(delivery: AlertDelivery, channel, body: dict) -> None:
    recipients = [a.strip() for a in channel.target.split(",") if a.strip()]
    text = f"{body['message']}\n\nsince {body['since']}\n{body['url']}\n"
    send_mail(title(delivery), text, settings.DEFAULT_FROM_EMAIL, recipients)


def _slack(delivery: AlertDelivery, channel, body: dict) -> None:
    data = json.dumps({"text": f"{title(delivery)}\n{body['message']}\n{body['url']}"})
    _post(channel, data, {"Content-Type": "application/json"})


def _webhook(delivery: AlertDelivery, channel, body: dict) -> None:
    data = json.dumps(body, sort_keys=True)
    _post(channel, data, {"Content-Type": "application/json", **signature(channel, data)})


def _post(channel, data: str, headers: dict[str, str]) -> None:
    url = channel.get_url()
    with scrubbing_logs(channel):
        # No redirects: a credential in the URL is for its host only, and a receiver that
        # redirects did not take the message (an answer that is not 2xx).
        response = requests.post(
            url, data=data.encode(), headers=headers, timeout=TIMEOUT, allow_redirects=False
        )
    if response.status_code >= 300:
        raise RuntimeError(f"{channel.target} answered {response.status_code}")  # masked


# How each kind of channel is sent to.
_SENDERS = {ChannelKind.EMAIL: _mail, ChannelKind.SLACK: _slack, ChannelKind.WEBHOOK: _webhook}


def signature(channel, data: str, *, at: int | None = None) -> dict[str, str]:
    """HMAC-SHA256 of "<timestamp>.<body>" with the channel's signing key (none: unsigned)."""
    key = channel.get_signing_key()
    if not key:
        return {}
    stamp = str(at if at is not None else int(time.time()))
    digest = hmac.new(key.encode(), f"{stamp}.{data}".encode(), hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: f"sha256={digest}"}


class _ScrubChannelSecrets(logging.Filter):
    """On requests' and urllib3's loggers: while this thread posts to a channel, the
    channel's URL secrets are masked in what they log (their debug lines carry the request
    line, path and query included)."""

    def __init__(self) -> None:
        super().__init__()
        self.current = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        channel = getattr(self.current, "channel", None)
        if channel is None:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is not ours to fix here
            return True
        cleaned = channel.scrub(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


_SCRUB = _ScrubChannelSecrets()
# A logger's filters only see records logged to that very logger: each module's, by name.
for _name in (
    "requests",
    "urllib3",
    "urllib3.connection",
    "urllib3.connectionpool",
    "urllib3.poolmanager",
    "urllib3.response",
    "urllib3.util.retry",
):
    logging.getLogger(_name).addFilter(_SCRUB)


@contextmanager
def scrubbing_logs(channel):
    previous = getattr(_SCRUB.current, "channel", None)
    _SCRUB.current.channel = channel
    try:
        yield
    finally:
        _SCRUB.current.channel = previous
