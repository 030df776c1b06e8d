"""No rule, nor many rules together, floods a channel: a rule's repeat interval has a floor
(CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS; less is a 400 naming `repeat_seconds`), and each
channel takes at most CONTROLPLANE_ALERT_CHANNEL_LIMIT messages per
CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES. The excess is recorded as suppressed deliveries,
never sent, and the next message that goes out says how many there were. The count is kept
in Postgres (the deliveries), not in a process: each evaluation round reads it afresh."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting import delivery, engine
from controlplane.alerting.models import AlertChannel, AlertDelivery, AlertRule
from controlplane.definitions.models import Pipeline
from tests.test_alerts import Receiver


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.shutdown()


def test_a_repeat_interval_below_the_floor_is_refused_naming_the_field(api, settings, db):
    body = {"name": "gave-up", "kind": "gave-up"}
    for seconds in (1, 59):
        response = api.post("/api/alert-rules/", {**body, "repeat_seconds": seconds}, format="json")
        assert (response.status_code, response.json()) == (
            400,
            {"repeat_seconds": ["must be 0 (never repeat) or at least 60 s"]},
        )
    assert not AlertRule.objects.exists()
    response = api.post("/api/alert-rules/", {**body, "repeat_seconds": 60}, format="json")
    assert response.status_code == 201, response.json()
    assert (
        api.patch("/api/alert-rules/gave-up/", {"repeat_seconds": 0}, format="json").json()[
            "repeat_seconds"
        ]
        == 0
    )  # never: allowed
    settings.CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS = 300
    response = api.patch("/api/alert-rules/gave-up/", {"repeat_seconds": 120}, format="json")
    assert response.status_code == 400
    assert response.json() == {"repeat_seconds": ["must be 0 (never repeat) or at least 300 s"]}
    assert AlertRule.objects.get().repeat_seconds == 0


def test_a_rule_stored_with_a_shorter_interval_still_repeats_no_faster_than_the_floor(
    pipeline, receiver
):
    hook = AlertChannel.objects.create(name="hook", kind="webhook", target=receiver.url)
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up", repeat_seconds=1)
    rule.channels.set([hook])
    Pipeline.objects.filter(name="orders").update(status="failed")
    t = timezone.now()
    assert engine.evaluate(t)["fired"] == 1
    assert engine.evaluate(t + timedelta(seconds=30))["repeated"] == 0
    assert engine.evaluate(t + timedelta(seconds=60))["repeated"] == 1


def test_a_channel_takes_at_most_its_limit_and_then_says_how_many_were_suppressed(
    pipeline, receiver, settings, api
):
    settings.CONTROLPLANE_ALERT_CHANNEL_LIMIT = 3
    settings.CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES = 15
    hook = AlertChannel.objects.create(name="hook", kind="webhook", target=f"{receiver.url}/h")
    calm = AlertChannel.objects.create(name="calm", kind="webhook", target=f"{receiver.url}/c")
    orders = Pipeline.objects.get(name="orders")
    for i in range(4):
        Pipeline.objects.create(name=f"p{i}", spec=orders.spec)
    Pipeline.objects.update(status="failed")  # five pipelines gave up at once
    # Two rules about every pipeline, both to `hook`; one of them to `calm` as well.
    loud = AlertRule.objects.create(name="gave-up", kind="gave-up", repeat_seconds=600)
    loud.channels.set([hook, calm])
    also = AlertRule.objects.create(name="also", kind="gave-up", repeat_seconds=0)
    also.channels.set([hook])

    t = timezone.now()
    summary = engine.evaluate(t)
    assert (summary["fired"], summary["suppressed"]) == (10, 7 + 2)
    outcomes = lambda channel: sorted(  # noqa: E731
        AlertDelivery.objects.filter(channel=channel).values_list("outcome", flat=True)
    )
    assert outcomes(hook) == ["pending"] * 3 + ["suppressed"] * 7
    assert outcomes(calm) == ["pending"] * 3 + ["suppressed"] * 2
    assert delivery.deliver(t) == {"sent": 6, "retry": 0, "failed": 0}  # suppressed: never sent
    assert len(receiver.posts) == 6

    # A later round within the window (a fresh process would count the same: it is read
    # from the deliveries): the reminders of `gave-up` are suppressed too.
    summary = engine.evaluate(t + timedelta(minutes=10))
    assert (summary["repeated"], summary["suppressed"]) == (5, 10)
    assert delivery.deliver(t + timedelta(minutes=10))["sent"] == 0

    # Past the window: the next message to each channel says how many it missed.
    later = t + timedelta(minutes=16)
    Pipeline.objects.filter(name="p0").update(status="stopped")  # one resolves
    summary = engine.evaluate(later)
    assert summary["resolved"] == 2 and summary["suppressed"] == 0
    first = AlertDelivery.objects.filter(channel=hook, outcome="pending").order_by("id").first()
    assert first.suppressed_before == 7 + 5
    assert first.message.endswith(
        "\n(12 earlier messages were not sent to this channel: at most 3 per 15 min)"
    )
    assert delivery.deliver(later)["sent"] == 3  # 2 to hook, 1 to calm
    sent = [json.loads(body) for path, _, body in receiver.posts[6:] if path == "/h"]
    assert [b["suppressed"] for b in sent] == [12, 0]
    assert "12 earlier messages were not sent" in sent[0]["message"]
    (to_calm,) = [json.loads(body) for path, _, body in receiver.posts[6:] if path == "/c"]
    assert to_calm["suppressed"] == 2 + 5

    # Over the API, each suppressed delivery is there, and the Prometheus counter.
    alerts = api.get("/api/alerts/?pipeline=p1").json()["results"]
    statuses = sorted(d["status"] for a in alerts for d in a["deliveries"])
    assert "suppressed" in statuses
    text = api.get("/metrics").content.decode()
    assert "cp_alert_deliveries_suppressed_total 19.0" in text


def test_a_limit_of_zero_sends_everything(pipeline, receiver, settings):
    settings.CONTROLPLANE_ALERT_CHANNEL_LIMIT = 0
    hook = AlertChannel.objects.create(name="hook", kind="webhook", target=receiver.url)
    orders = Pipeline.objects.get(name="orders")
    for i in range(24):
        Pipeline.objects.create(name=f"p{i}", spec=orders.spec)
    Pipeline.objects.update(status="failed")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    rule.channels.set([hook])
    assert engine.evaluate(timezone.now())["suppressed"] == 0
    assert AlertDelivery.objects.filter(outcome="pending").count() == 25
