"""Alerting over the API: channels (admins; the signing key never shown), rules (editors;
parameters checked, naming the field), silences and acknowledgements (operators), all
audited; alerts with their deliveries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertChannel, AlertDelivery, AlertRule
from controlplane.definitions.models import AuditEntry, Pipeline
from tests.clients import client_as


@pytest.fixture
def admin(django_user_model):
    return client_as(django_user_model, "admin")


@pytest.fixture
def operator(django_user_model):
    return client_as(django_user_model, "operator")


def test_admins_define_channels_and_the_signing_key_is_never_shown(admin, api):
    response = admin.post(
        "/api/alert-channels/",
        {"name": "hook", "kind": "webhook", "target": "https://hooks.example/x",
         "signing_key": "s3cret-key"},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    assert "signing_key" not in response.json() and response.json()["has_signing_key"] is True
    assert AlertChannel.objects.get(name="hook").get_signing_key() == "s3cret-key"
    assert "s3cret-key" not in AlertChannel.objects.get(name="hook").secret_encrypted
    listed = api.get("/api/alert-channels/").json()["results"]
    assert "s3cret-key" not in str(listed)
    entry = AuditEntry.objects.get(action="alert-channel-create")
    assert entry.after == {
        "channel": "hook", "kind": "webhook", "target": "https://hooks.example/x",
        "signing_key": True,
    }  # fmt: skip
    # An editor may not say where the control plane sends messages.
    response = api.post(
        "/api/alert-channels/",
        {"name": "x", "kind": "email", "target": "a@example.com"},
        format="json",
    )
    assert response.status_code == 403


BAD_CHANNELS = [
    (
        {"kind": "email", "target": "not-an-address"},
        {"target": ["'not-an-address' is not an e-mail address"]},
    ),
    ({"kind": "webhook", "target": "file:///etc/passwd"}, {"target": ["must be an http(s) URL"]}),
    (
        {"kind": "slack", "target": "https://x.example/y", "signing_key": "k"},
        {"signing_key": ["only webhooks are signed"]},
    ),
    ({"kind": "pager", "target": "x"}, {"kind": ['"pager" is not a valid choice.']}),
]


@pytest.mark.parametrize(("body", "errors"), BAD_CHANNELS)
def test_bad_channels_are_refused_naming_the_field(admin, body, errors):
    response = admin.post("/api/alert-channels/", {"name": "c", **body}, format="json")
    assert response.status_code == 400
    assert response.json() == errors
    assert not AlertChannel.objects.exists()


def test_editors_define_rules_whose_parameters_are_checked(api, pipeline):
    AlertChannel.objects.create(name="mail", kind="email", target="a@example.com")
    body = {
        "name": "orders-lag", "kind": "lag-seconds", "params": {"above": 120},
        "pipeline": "orders", "for_seconds": 300, "channels": ["mail"],
    }  # fmt: skip
    response = api.post("/api/alert-rules/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["channels"] == ["mail"] and response.json()["repeat_seconds"] == 1800
    for bad, errors in (
        ({"params": {"above": "lots"}}, {"params": ["lag-seconds needs above (a number)"]}),
        ({"kind": "fire"}, {"kind": ['"fire" is not a valid choice.']}),
        ({"pipeline": "nope"}, {"pipeline": ["Object with name=nope does not exist."]}),
        (
            {"kind": "control-plane", "params": {"minutes": 2}},
            {"pipeline": ["a control-plane rule is about the control plane, not a pipeline"]},
        ),
    ):
        response = api.post("/api/alert-rules/", {**body, "name": "x", **bad}, format="json")
        assert (response.status_code, response.json()) == (400, errors)
    assert AuditEntry.objects.get(action="alert-rule-create").pipeline_name == "orders"


def failing_alert(pipeline_name: str = "orders") -> tuple[AlertRule, Alert]:
    Pipeline.objects.filter(name=pipeline_name).update(status="failed")
    channel = AlertChannel.objects.create(name="mail", kind="email", target="a@example.com")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up", repeat_seconds=600)
    rule.channels.set([channel])
    engine.evaluate(timezone.now())
    return rule, Alert.objects.get(rule=rule)


def test_operators_acknowledge_a_firing_alert_and_its_reminders_stop(operator, api, pipeline):
    _rule, alert = failing_alert()
    listed = api.get("/api/alerts/?state=open").json()["results"]
    assert [(a["rule"], a["subject"], a["state"]) for a in listed] == [
        ("gave-up", "orders", "firing")
    ]
    assert listed[0]["deliveries"][0]["status"] == "pending"
    url = f"/api/alerts/{alert.pk}/acknowledge/"
    assert api.post(url, {"reason": "on it"}, format="json").status_code == 200  # editors too
    alert.refresh_from_db()
    assert alert.acknowledged_by.username == "oncall"
    assert AuditEntry.objects.get(action="alert-acknowledge").reason == "on it"
    later = timezone.now() + timedelta(hours=2)
    assert engine.evaluate(later)["repeated"] == 0  # acknowledged: no reminder
    assert AlertDelivery.objects.filter(event="repeat").count() == 0


def test_a_rule_silenced_through_the_api_sends_nothing_until_unsilenced(operator, pipeline):
    channel = AlertChannel.objects.create(name="mail", kind="email", target="a@example.com")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    rule.channels.set([channel])
    response = operator.post(
        "/api/alert-rules/gave-up/silence/", {"minutes": 60, "reason": "maintenance"}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["silence_reason"] == "maintenance"
    Pipeline.objects.filter(name="orders").update(status="failed")
    assert engine.evaluate(timezone.now())["silenced"] == 1
    assert not AlertDelivery.objects.exists()
    assert operator.post("/api/alert-rules/gave-up/unsilence/").status_code == 200
    assert [e.action for e in AuditEntry.objects.order_by("id")][-2:] == [
        "alert-rule-silence", "alert-rule-unsilence",
    ]  # fmt: skip
    response = operator.post("/api/alert-rules/gave-up/silence/", {"minutes": 0}, format="json")
    assert response.status_code == 400 and "minutes" in response.json()


def test_only_a_firing_alert_is_acknowledged(operator, pipeline):
    _rule, alert = failing_alert()
    Pipeline.objects.filter(name="orders").update(status="stopped")
    engine.evaluate(timezone.now())
    response = operator.post(f"/api/alerts/{alert.pk}/acknowledge/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"alert {alert.pk} is resolved: only a firing alert is acknowledged"
    )


def test_firing_alerts_are_scraped_by_prometheus(api, pipeline):
    failing_alert()
    text = api.get("/metrics").content.decode()
    assert 'cp_alert_firing{acknowledged="false",rule="gave-up",subject="orders"} 1.0' in text
    assert "cp_alert_deliveries_failed_total 0.0" in text


def test_a_rule_for_a_label_watches_only_the_pipelines_carrying_it(api, pipeline):
    from tests.factories import valid_spec

    body = {"name": "pay", "spec": valid_spec(), "labels": {"team": "payments"}}
    assert api.post("/api/pipelines/", body, format="json").status_code == 201
    Pipeline.objects.update(status="failed")  # orders and pay both gave up
    response = api.post(
        "/api/alert-rules/", {"name": "payments", "kind": "gave-up", "label": "team:payments"},
        format="json",
    )  # fmt: skip
    assert response.status_code == 201, response.json()
    engine.evaluate(timezone.now())
    assert list(Alert.objects.values_list("subject", flat=True)) == ["pay"]
    response = api.post(
        "/api/alert-rules/", {"name": "bad", "kind": "gave-up", "label": "team"}, format="json"
    )
    assert response.json() == {"label": ["'team' is not name:value (e.g. team:payments)"]}


def test_the_alerts_page_shows_what_fires_and_operators_act_on_it(django_user_model, pipeline):
    import re

    from django.test import Client

    from controlplane.accounts.roles import set_role

    rule, alert = failing_alert()
    viewer, operator = Client(), Client()
    for client, role in ((viewer, "viewer"), (operator, "operator")):
        user = django_user_model.objects.create_user(username=f"p-{role}", password="x-n-u-1")
        set_role(user, role)
        client.force_login(user)
    html = viewer.get("/alerts/").content.decode()
    marker = f'data-alert="{alert.pk}">'
    row = html[html.index(marker) + len(marker) :]
    row = " ".join(re.sub(r"<[^>]+>", " ", row[: row.index("</tr>")]).split())
    assert row.startswith("gave-up orders firing") and "the pipeline is failed" in row
    assert ">Acknowledge</button>" not in html and ">Silence</button>" not in html  # viewer
    assert ">Alerts</a>" in html  # in the nav

    page = operator.post(f"/alerts/{alert.pk}/acknowledge", {"reason": "looking"}, follow=True)
    assert "Alert gave-up on orders acknowledged." in page.content.decode()
    alert.refresh_from_db()
    assert alert.acknowledged_by.username == "p-operator"
    page = operator.post(f"/alerts/{alert.pk}/acknowledge", follow=True).content.decode()
    assert "acknowledged by p-operator" in page

    page = operator.post(
        "/alerts/rules/gave-up/silence", {"minutes": "60", "reason": "deploy"}, follow=True
    ).content.decode()
    assert "Rule gave-up silenced for 60 minutes." in page
    rule.refresh_from_db()
    assert rule.silence_reason == "deploy" and rule.silenced_until > timezone.now()
    operator.post("/alerts/rules/gave-up/silence", {"minutes": "0"})
    rule.refresh_from_db()
    assert rule.silenced_until is None
    assert [e.action for e in AuditEntry.objects.order_by("id")][-3:] == [
        "alert-acknowledge", "alert-rule-silence", "alert-rule-unsilence",
    ]  # fmt: skip
