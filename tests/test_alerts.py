"""Alerts end to end, against real services: an SMTP server (aiosmtpd) and an HTTP receiver
in the test session get the alerts of a pipeline whose (stand-in) driver is killed with
SIGKILL until its restart policy gives up: once per firing, the repeats, and the
resolution; a silenced rule sends nothing; a webhook that fails is tried again; a lag rule
fires when a stopped pipeline falls behind (real Kafka, the real metrics collector)."""

from __future__ import annotations

import hashlib
import hmac
import json
import signal
from datetime import timedelta
from email import message_from_bytes

import psutil
import pytest
from aiosmtpd.controller import Controller
from django.utils import timezone

from controlplane.alerting import delivery, engine
from controlplane.alerting.models import (
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertRule,
)
from controlplane.definitions.models import Run, RunState
from controlplane.observability.collector import collect
from tests.kafka_helpers import new_topic, produce
from tests.outage_stack import free_port
from tests.receivers import Receiver  # noqa: F401 - imported from here by other alert tests
from tests.runs import orders, step
from tests.waiting import wait_for


class Mailbox:
    def __init__(self) -> None:
        self.messages = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp(settings):
    box = Mailbox()
    controller = Controller(box, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", controller.port
    yield box
    controller.stop()


@pytest.fixture
def channels(receiver, smtp):
    mail = AlertChannel.objects.create(name="mail", kind="email", target="oncall@example.com")
    hook = AlertChannel(name="hook", kind="webhook", target=f"{receiver.url}/hook")
    hook.set_signing_key("hook-secret")
    hook.save()
    slack = AlertChannel.objects.create(name="slack", kind="slack", target=f"{receiver.url}/slack")
    return [mail, hook, slack]


def deliver_all(now) -> dict:
    counts = delivery.deliver(now)
    assert counts["retry"] == counts["failed"] == 0, list(AlertDelivery.objects.values())
    return counts


def killed_until_it_gives_up(api, env) -> timezone.datetime:
    """Start the pipeline (one restart allowed) and SIGKILL each run's driver process as
    soon as it runs, until the policy gives up."""
    env.setenv("STANDIN_MODE", "silent")  # runs until killed
    response = api.patch(
        "/api/pipelines/orders/",
        {"spec": {"restart_policy": {"kind": "fixed-delay", "attempts": 1, "delay_seconds": 0}}},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    killed: set[int] = set()

    def gave_up() -> bool:
        if orders().status == "failed":
            return True
        step(timezone.now())
        run = Run.objects.filter(pipeline=orders(), state=RunState.RUNNING).first()
        if run is not None and run.pid and run.generation not in killed:
            try:
                drivers = psutil.Process(run.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                drivers = []
            for driver in drivers:
                driver.send_signal(signal.SIGKILL)
            if drivers:
                killed.add(run.generation)
        return False

    wait_for(gave_up, 60)
    assert orders().status == "failed", orders().status
    assert killed == {1, 2}
    summaries = [f["summary"] for f in api.get("/api/pipelines/orders/failures/").json()["results"]]
    assert summaries == ["killed by signal 9 (SIGKILL)"] * 2
    return timezone.now()


def test_a_pipeline_that_gives_up_is_alerted_once_repeated_and_resolved(
    api,
    standin,
    channels,
    smtp,
    receiver,
):
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up", repeat_seconds=1800)
    rule.channels.set(channels)
    quiet = AlertRule.objects.create(
        name="quiet", kind="gave-up", silenced_until=timezone.now() + timedelta(hours=1)
    )
    quiet.channels.set(channels)
    t = killed_until_it_gives_up(api, standin)

    summary = engine.evaluate(t)
    assert (summary["fired"], summary["silenced"]) == (2, 1)
    assert deliver_all(t) == {"sent": 3, "retry": 0, "failed": 0}
    # Evaluated again: still firing, nothing more is sent.
    assert engine.evaluate(t + timedelta(minutes=1))["fired"] == 0
    assert deliver_all(t + timedelta(minutes=1))["sent"] == 0

    ((rcpts, mail),) = smtp.messages
    assert rcpts == ["oncall@example.com"]
    assert mail["Subject"] == "[FIRING] gave-up: orders"
    assert "the restart policy gave up: the pipeline is failed" in mail.get_payload()
    posts = {path: (headers, body) for path, headers, body in receiver.posts}
    headers, body = posts["/hook"]
    sent = json.loads(body)
    assert (sent["event"], sent["rule"], sent["pipeline"]) == ("firing", "gave-up", "orders")
    stamp = headers["X-Controlplane-Timestamp"]
    expected = hmac.new(b"hook-secret", f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert headers["X-Controlplane-Signature"] == f"sha256={expected}"
    assert json.loads(posts["/slack"][1])["text"].startswith("[FIRING] gave-up: orders\n")
    assert "X-Controlplane-Signature" not in posts["/slack"][0]

    # Still failed half an hour later: the reminder. The silenced rule still sends nothing.
    later = t + timedelta(minutes=30)
    assert engine.evaluate(later)["repeated"] == 2
    assert deliver_all(later)["sent"] == 3
    assert smtp.messages[-1][1]["Subject"] == "[STILL FIRING] gave-up: orders"

    # An operator starts it again: the condition is gone, the alert resolves.
    assert api.post("/api/pipelines/orders/start/").status_code == 202
    resolved_at = later + timedelta(minutes=1)
    assert engine.evaluate(resolved_at)["resolved"] == 2
    assert deliver_all(resolved_at)["sent"] == 3
    assert smtp.messages[-1][1]["Subject"] == "[RESOLVED] gave-up: orders"
    assert len(smtp.messages) == 3 and len(receiver.posts) == 6
    alert = Alert.objects.get(rule=rule)
    assert (alert.state, alert.repeats, alert.resolved_at) == ("resolved", 1, resolved_at)
    assert list(
        AlertDelivery.objects.filter(alert=alert, channel__name="hook")
        .order_by("id")
        .values_list("event", "outcome", "attempts")
    ) == [("firing", "sent", 1), ("repeat", "sent", 1), ("resolved", "sent", 1)]
    assert not AlertDelivery.objects.filter(alert__rule=quiet).exists()


def test_a_webhook_that_fails_is_tried_again_and_every_attempt_is_recorded(
    api, pipeline, channels, receiver
):
    from controlplane.definitions.models import Pipeline

    Pipeline.objects.filter(name="orders").update(status="failed")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    rule.channels.set([c for c in channels if c.name == "hook"])
    receiver.fail_next = 2
    t = timezone.now()
    engine.evaluate(t)
    assert delivery.deliver(t) == {"sent": 0, "retry": 1, "failed": 0}
    row = AlertDelivery.objects.get()
    assert (row.outcome, row.attempts, row.next_try_at) == ("pending", 1, t + timedelta(seconds=10))
    assert "answered 503" in row.last_error
    assert delivery.deliver(t + timedelta(seconds=5))["retry"] == 0  # not due yet
    assert delivery.deliver(t + timedelta(seconds=10))["retry"] == 1
    assert delivery.deliver(t + timedelta(seconds=40))["sent"] == 1
    row.refresh_from_db()
    assert (row.outcome, row.attempts, row.last_error) == ("sent", 3, "")
    assert len(receiver.posts) == 1


def test_a_lag_rule_fires_when_a_stopped_pipeline_falls_behind(
    api, kafka_connection, postgres_connection, kafka_bootstrap, channels, receiver
):
    topic = new_topic(kafka_bootstrap)
    spec = {
        "source": {
            "connection": "events", "topics": [topic], "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": "lagging"},
    }  # fmt: skip
    assert (
        api.post("/api/pipelines/", {"name": "behind", "spec": spec}, format="json").status_code
        == 201
    )
    rule = AlertRule.objects.create(
        name="behind", kind="lag-records", params={"above": 40}, for_seconds=60
    )
    rule.channels.set([c for c in channels if c.name == "hook"])
    t = timezone.now()
    collect(t)
    assert engine.evaluate(t)["fired"] == 0  # nothing to read yet
    produce(kafka_bootstrap, topic, ({"id": f"r{i}", "n": i} for i in range(50)))
    collect(t + timedelta(seconds=10))
    engine.evaluate(t + timedelta(seconds=10))
    assert Alert.objects.get(rule=rule).state == "pending"  # not yet for 60 s
    collect(t + timedelta(seconds=80))
    assert engine.evaluate(t + timedelta(seconds=80))["fired"] == 1
    deliver_all(t + timedelta(seconds=80))
    ((path, _, body),) = receiver.posts
    assert path == "/hook"
    assert json.loads(body)["message"] == "lag 50 records (above 40)"
