"""Alert channel URLs are secrets: a webhook URL's user info and query values, and a
Slack-style webhook's path, are write-only. Stored encrypted; masked on every read (the API
for every role that reads channels, the alerts page, the admin's list and change form, the
audit trail); kept when the masked URL is sent back to the same scheme, host and port;
scrubbed out of delivery errors (a real delivery to a port that refuses connections) and
out of logs."""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta

import pytest
from django.db import connection as db
from django.utils import timezone

from controlplane.alerting import delivery, engine, targets
from controlplane.alerting.models import Alert, AlertChannel, AlertDelivery, AlertRule
from controlplane.definitions.models import AuditEntry, Pipeline
from tests.api.test_rollback import client_as
from tests.test_alerts import Receiver
from tests.test_pages import client_with

HOOK = (
    "https://bot:pw-Hook-Secret-1@hooks.example.com/alerts/in?code=Code-Value-2&team=Team-Value-7"
)
HOOK_MASKED = "https://***@hooks.example.com/alerts/in?code=***&team=***"
SLACK = "https://hooks.slack.com/services/T0AAA/B0BBB/XxSlackSecret3"
SLACK_MASKED = "https://hooks.slack.com/services/•••"
SECRETS = (
    "pw-Hook-Secret-1",
    "Code-Value-2",
    "Team-Value-7",
    "XxSlackSecret3",
    "T0AAA/B0BBB",
    "bot:pw",
)


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, (secret, text)


def raw_rows(table: str) -> str:
    """Every column of every row, as stored (what a database dump would show)."""
    with db.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table}")
        return repr(cursor.fetchall())


@pytest.fixture
def admin(django_user_model):
    return client_as(django_user_model, "admin")


@pytest.fixture
def channels(admin):
    for name, kind, target in (("hook", "webhook", HOOK), ("slack", "slack", SLACK)):
        response = admin.post(
            "/api/alert-channels/", {"name": name, "kind": kind, "target": target}, format="json"
        )
        assert response.status_code == 201, response.json()
    return AlertChannel.objects.order_by("name")


# -- pure: masking, resolving, scrubbing ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind", "shown"),
    [
        (HOOK, "webhook", HOOK_MASKED),
        (SLACK, "slack", SLACK_MASKED),
        (SLACK, "webhook", SLACK_MASKED),  # the host's path is the credential whatever the kind
        ("https://chat.example/abc123", "slack", "https://chat.example/•••"),
        ("http://127.0.0.1:8080/hook", "webhook", "http://127.0.0.1:8080/hook"),
        ("https://h.example/p?bare-token&x=#frag", "webhook", "https://h.example/p?***&x=#***"),
    ],
)
def test_the_secret_parts_of_a_url_are_masked(url, kind, shown):
    assert targets.mask(url, kind) == shown
    assert targets.resolve(shown, kind, url) == url  # sent back masked: the same URL


def test_a_masked_url_keeps_only_what_it_may_keep():
    stored = "https://u:p@h.example/a?token=t1&token=t2&sig=s"
    # Another path, the same credentials; a new parameter given in full; percent-encoded masks.
    assert (
        targets.resolve(
            "https://***@h.example:443/b?token=%2A%2A%2A&token=***&n=1", "webhook", stored
        )
        == "https://u:p@h.example:443/b?token=t1&token=t2&n=1"
    )
    for submitted, problem in (
        ("http://***@h.example/a", "another scheme, host or port"),
        ("https://***@elsewhere.example/a", "another scheme, host or port"),
        ("https://***@h.example:8443/a", "another scheme, host or port"),
        ("https://h.example/a?other=***", "no stored value of the query parameter 'other'"),
        ("https://h.example/a#***", "no stored fragment"),
    ):
        with pytest.raises(targets.TargetProblem, match=problem):
            targets.resolve(submitted, "webhook", stored)
    with pytest.raises(targets.TargetProblem, match="this channel has none"):
        targets.resolve("https://***@h.example/", "webhook", None)
    slack = "https://hooks.slack.com/services/T1/B2/C3"
    with pytest.raises(targets.TargetProblem, match="path is masked but is not the stored one"):
        targets.resolve("https://hooks.slack.com/other/•••", "slack", slack)


def test_errors_are_scrubbed_of_every_form_of_the_url_and_its_values():
    url = "http://us%40er:p%40ss-word@127.0.0.1:9/hook?code=abc%2Fdef-1&x=a b"
    error = (
        "HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
        "/hook?code=abc%2Fdef-1&x=a%20b (Caused by NewConnectionError(...)); "
        f"posting to {url}; decoded abc/def-1; basic dXNAZXI6cEBzcy13b3Jk"
    )
    scrubbed = targets.scrub(error, url, "webhook")
    for secret in ("abc", "a%20b", "p%40ss", "p@ss", "dXNAZXI6cEBzcy13b3Jk"):
        assert secret not in scrubbed, (secret, scrubbed)
    assert "url: /hook?code=" in scrubbed and "port=9" in scrubbed  # still says where


# -- reads: the API for every role, the page, the admin, the audit trail --------------------


def test_channel_urls_are_stored_encrypted_and_masked_on_every_read(
    channels, admin, django_user_model
):
    hook, slack = channels.get(name="hook"), channels.get(name="slack")
    assert (hook.target, slack.target) == (HOOK_MASKED, SLACK_MASKED)
    assert (hook.get_url(), slack.get_url()) == (HOOK, SLACK)
    assert_no_secret(raw_rows("alerting_alertchannel"))
    assert_no_secret(raw_rows("pipelines_auditentry"))

    for role in ("viewer", "operator", "editor", "admin"):
        reader = admin if role == "admin" else client_as(django_user_model, role)
        listed = reader.get("/api/alert-channels/")
        assert listed.status_code == 200
        assert_no_secret(listed.content.decode())
        shown = {
            c["name"]: (c["target"], c["target_has_secrets"]) for c in listed.json()["results"]
        }
        assert shown == {"hook": (HOOK_MASKED, True), "slack": (SLACK_MASKED, True)}
        one = reader.get("/api/alert-channels/hook/")
        assert one.json()["target"] == HOOK_MASKED
        assert_no_secret(one.content.decode())

    page = client_with(django_user_model, "viewer").get("/alerts/").content.decode()
    assert 'data-channel="hook"' in page and HOOK_MASKED.replace("&", "&amp;") in page
    assert SLACK_MASKED in page
    assert_no_secret(page)

    entries = AuditEntry.objects.filter(action="alert-channel-create").order_by("id")
    assert [e.after for e in entries] == [
        {"channel": "hook", "kind": "webhook", "target": HOOK_MASKED, "signing_key": False,
         "url_secrets": True},
        {"channel": "slack", "kind": "slack", "target": SLACK_MASKED, "signing_key": False,
         "url_secrets": True},
    ]  # fmt: skip
    assert_no_secret(client_with(django_user_model, "viewer").get("/audit/").content.decode())
    assert_no_secret(admin.get("/api/audit/").content.decode())


def test_the_admin_shows_channels_masked_and_keeps_the_secret_when_sent_back(
    channels, admin_client
):
    hook = channels.get(name="hook")
    listed = admin_client.get("/admin/alerting/alertchannel/").content.decode()
    assert "hooks.example.com" in listed
    assert_no_secret(listed)
    url = f"/admin/alerting/alertchannel/{hook.pk}/change/"
    form = admin_client.get(url).content.decode()
    assert f'value="{HOOK_MASKED.replace("&", "&amp;")}"' in form
    assert_no_secret(form)

    # Sent back as shown, with a signing key: the URL is kept, the key set.
    post = {"name": "hook", "kind": "webhook", "target": HOOK_MASKED, "signing_key": "k-1234"}
    assert admin_client.post(url, post).status_code == 302
    hook.refresh_from_db()
    assert (hook.target, hook.get_url(), hook.get_signing_key()) == (HOOK_MASKED, HOOK, "k-1234")
    # Elsewhere with the masks: refused on `target`, nothing changed.
    moved = {**post, "target": "https://***@evil.example/alerts/in?code=***&team=***"}
    response = admin_client.post(url, moved)
    assert response.status_code == 200
    assert "another scheme, host or port" in response.content.decode()
    hook.refresh_from_db()
    assert hook.get_url() == HOOK
    # Elsewhere in full: the new URL, and the audit says its secrets changed.
    moved["target"] = "https://other.example/in?key=k-New-Secret-4"
    assert admin_client.post(url, moved).status_code == 302
    hook.refresh_from_db()
    assert (hook.target, hook.get_url()) == (
        "https://other.example/in?key=***",
        "https://other.example/in?key=k-New-Secret-4",
    )
    entry = AuditEntry.objects.filter(action="alert-channel-update").latest("id")
    assert entry.after["url_secrets_changed"] is True
    assert "k-New-Secret-4" not in json.dumps([entry.before, entry.after])
    assert "k-New-Secret-4" not in admin_client.get(url).content.decode()


# -- editing over the API -------------------------------------------------------------------


def test_editing_keeps_the_stored_secret_for_the_same_endpoint_and_drops_it_for_another(
    channels, admin
):
    url = "/api/alert-channels/hook/"
    # Sent back exactly as read (a PUT of what GET gave): nothing changes.
    body = {k: v for k, v in admin.get(url).json().items() if k in ("name", "kind", "target")}
    assert admin.put(url, body, format="json").status_code == 200
    assert AlertChannel.objects.get(name="hook").get_url() == HOOK
    update = AuditEntry.objects.filter(action="alert-channel-update").latest("id")
    assert update.before == update.after  # nothing secret changed either

    # Another path on the same host, the credentials kept.
    moved = "https://***@hooks.example.com/v2/in?code=***&team=***"
    response = admin.patch(url, {"target": moved}, format="json")
    assert (response.status_code, response.json()["target"]) == (200, moved)
    assert AlertChannel.objects.get(name="hook").get_url() == (
        "https://bot:pw-Hook-Secret-1@hooks.example.com/v2/in?code=Code-Value-2&team=Team-Value-7"
    )
    # A rotated token: the mask reads the same, the audit says the secret changed.
    rotated = "https://***@hooks.example.com/v2/in?code=Rot-Value-5&team=***"
    assert admin.patch(url, {"target": rotated}, format="json").json()["target"] == moved
    assert "Rot-Value-5" in AlertChannel.objects.get(name="hook").get_url()
    entry = AuditEntry.objects.filter(action="alert-channel-update").latest("id")
    assert entry.after["url_secrets_changed"] is True and entry.after["target"] == moved
    assert "Rot-Value-5" not in json.dumps([entry.before, entry.after])

    before = AlertChannel.objects.get(name="hook").get_url()
    refusals = [
        # Another host, scheme or port with the masks: the stored credentials stay home.
        ({"target": "https://***@evil.example/v2/in?code=***&team=***"}, "another scheme, host"),
        ({"target": "http://***@hooks.example.com/v2/in?code=***&team=***"}, "another scheme"),
        ({"target": "https://***@hooks.example.com:8443/v2/in?token=***"}, "host or port"),
        ({"target": "https://hooks.example.com/v2/in?code=***&sig=***"}, "'sig'"),
        ({"kind": "slack"}, "give the URL in full when changing the kind"),
        ({"target": "ftp://hooks.example.com/x"}, "must be an http(s) URL"),
    ]
    for change, problem in refusals:
        response = admin.patch(url, change, format="json")
        assert response.status_code == 400, (change, response.json())
        assert list(response.json()) == ["target"] and problem in response.json()["target"][0]
        assert_no_secret(response.content.decode())
    assert AlertChannel.objects.get(name="hook").get_url() == before

    # A new host in full: its own (new) secrets; the old ones are gone.
    response = admin.patch(url, {"target": "https://new.example/in?sig=s-New-6"}, format="json")
    assert response.json()["target"] == "https://new.example/in?sig=***"
    assert AlertChannel.objects.get(name="hook").get_url() == "https://new.example/in?sig=s-New-6"
    # Masks for a channel with nothing stored: refused.
    response = admin.post(
        "/api/alert-channels/",
        {"name": "fresh", "kind": "webhook", "target": "https://h.example/?token=***"},
        format="json",
    )
    assert response.status_code == 400 and "this channel has none" in response.json()["target"][0]
    # The Slack path is kept when sent back, refused for another host.
    response = admin.patch("/api/alert-channels/slack/", {"target": SLACK_MASKED}, format="json")
    assert response.status_code == 200
    assert AlertChannel.objects.get(name="slack").get_url() == SLACK


def test_a_full_url_given_in_code_is_split_on_save_too(db):
    channel = AlertChannel.objects.create(name="direct", kind="webhook", target=HOOK)
    channel.refresh_from_db()
    assert (channel.target, channel.get_url()) == (HOOK_MASKED, HOOK)
    assert_no_secret(raw_rows("alerting_alertchannel"))


def test_the_migration_hides_urls_already_stored(db):
    """Channels stored before: the URL moves into url_encrypted, and delivery errors and
    audit entries that quote it are scrubbed."""
    import importlib

    from django.apps import apps

    pipeline = Pipeline.objects.create(name="p", spec={})
    rule = AlertRule.objects.create(name="r", kind="gave-up")
    alert = Alert.objects.create(
        rule=rule, pipeline=pipeline, subject="p", state="firing", message="m",
        since=timezone.now(),
    )  # fmt: skip
    channel = AlertChannel.objects.create(name="old", kind="webhook", target="http://x.example/")
    AlertChannel.objects.filter(pk=channel.pk).update(target=HOOK, url_encrypted="")  # as before
    AlertDelivery.objects.create(
        alert=alert, channel=channel, event="firing", message="m", next_try_at=timezone.now(),
        last_error=f"ConnectionError: url: /alerts/in?code=Code-Value-2&team=Team-Value-7; {HOOK}",
    )  # fmt: skip
    AuditEntry.objects.create(
        actor_name="a", action="alert-channel-create", before={},
        after={"channel": "old", "kind": "webhook", "target": HOOK, "signing_key": False},
    )  # fmt: skip
    migration = importlib.import_module(
        "controlplane.alerting.migrations.0004_channel_url_secrets_and_rate_limit"
    )
    migration.hide_url_secrets(apps, None)
    channel.refresh_from_db()
    assert (channel.target, channel.get_url()) == (HOOK_MASKED, HOOK)
    error = AlertDelivery.objects.get().last_error
    assert error.startswith("ConnectionError: url: /alerts/in?code=") and HOOK_MASKED in error
    assert AuditEntry.objects.get(action="alert-channel-create").after["target"] == HOOK_MASKED
    for table in ("alerting_alertchannel", "alerting_alertdelivery", "pipelines_auditentry"):
        assert_no_secret(raw_rows(table))


# -- delivery: a real failure, recorded and logged without the secret ------------------------


@pytest.fixture
def refused_port():
    """A port bound but not listening: connecting to it is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


def test_a_delivery_that_fails_records_and_logs_the_error_without_the_secret(
    pipeline, refused_port, admin, api, django_user_model, caplog
):
    base = f"http://bot:pw-Hook-Secret-1@127.0.0.1:{refused_port}"
    for name, kind, target in (
        ("hook", "webhook", f"{base}/alerts/in?code=Code-Value-2&team=Team-Value-7"),
        ("slack", "slack", f"http://127.0.0.1:{refused_port}/services/T0AAA/B0BBB/XxSlackSecret3"),
    ):
        response = admin.post(
            "/api/alert-channels/", {"name": name, "kind": kind, "target": target}, format="json"
        )
        assert response.status_code == 201, response.json()
    Pipeline.objects.filter(name="orders").update(status="failed")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    rule.channels.set(AlertChannel.objects.all())
    caplog.set_level(logging.DEBUG)
    t = timezone.now()
    engine.evaluate(t)
    assert delivery.deliver(t) == {"sent": 0, "retry": 2, "failed": 0}
    errors = dict(AlertDelivery.objects.values_list("channel__name", "last_error"))
    for error in errors.values():
        assert error.startswith("ConnectionError: "), error
        assert "Connection refused" in error and f"port={refused_port}" in error, error
    assert "/alerts/in?code=" in errors["hook"]  # it still says where it went
    assert "/services/•••" in errors["slack"]

    # Every later attempt fails too, until the delivery has failed for good (logged).
    at = t
    for wait in delivery.BACKOFF_SECONDS:
        at += timedelta(seconds=wait)
        delivery.deliver(at)
    assert set(AlertDelivery.objects.values_list("outcome", flat=True)) == {"failed"}
    assert "failed for good" in caplog.text and "Connection refused" in caplog.text
    assert f"127.0.0.1:{refused_port}" in caplog.text  # urllib3's debug lines were captured

    assert_no_secret(caplog.text)
    assert_no_secret(raw_rows("alerting_alertdelivery"))
    assert_no_secret(raw_rows("pipelines_auditentry"))
    alerts = api.get("/api/alerts/")
    assert alerts.json()["results"][0]["deliveries"][0]["last_error"].startswith("ConnectionError")
    assert_no_secret(alerts.content.decode())
    page = client_with(django_user_model, "viewer").get("/alerts/").content.decode()
    assert "Connection refused" in page
    assert_no_secret(page)


def test_a_webhook_gets_the_full_url_and_an_error_answer_is_recorded_masked(
    pipeline, admin, caplog
):
    receiver = Receiver()
    try:
        target = f"{receiver.url}/alerts/in?code=Code-Value-2&team=Team-Value-7"
        response = admin.post(
            "/api/alert-channels/", {"name": "hook", "kind": "webhook", "target": target},
            format="json",
        )  # fmt: skip
        assert response.json()["target"] == f"{receiver.url}/alerts/in?code=***&team=***"
        Pipeline.objects.filter(name="orders").update(status="failed")
        rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
        rule.channels.set(AlertChannel.objects.all())
        caplog.set_level(logging.DEBUG)
        receiver.fail_next = 1
        t = timezone.now()
        engine.evaluate(t)
        assert delivery.deliver(t)["retry"] == 1
        row = AlertDelivery.objects.get()
        assert row.last_error == (
            f"RuntimeError: {receiver.url}/alerts/in?code=***&team=*** answered 503"
        )
        assert delivery.deliver(t + timedelta(seconds=10))["sent"] == 1
        ((path, _headers, _body),) = receiver.posts
        assert (
            path == "/alerts/in?code=Code-Value-2&team=Team-Value-7"
        )  # the receiver got the real URL
        assert "POST /alerts/in?code=" in caplog.text  # urllib3 logged its request line
        assert_no_secret(caplog.text)
    finally:
        receiver.shutdown()


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("http://[::1", "must be an http(s) URL"),
        ("not a url", "must be an http(s) URL"),
        ("https://h.example/•••", "this channel has none"),
        ("https://h.example/x?" + "&".join(["a=1"] * 450), "at most 2000 characters"),
    ],
)
def test_odd_targets_are_refused_naming_the_field(admin, target, problem):
    response = admin.post(
        "/api/alert-channels/", {"name": "odd", "kind": "webhook", "target": target}, format="json"
    )
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["target"] and problem in response.json()["target"][0]
    assert not AlertChannel.objects.exists()
