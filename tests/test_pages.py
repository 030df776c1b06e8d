"""Server-rendered pages: roles enforced on every page, and the overview (problems first)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from controlplane.accounts.roles import set_role
from controlplane.definitions.models import Pipeline
from controlplane.observability import metrics
from controlplane.observability.collector import collect
from tests.clients import client_with
from tests.factories import valid_spec

# Every page outside the API and the Django admin, with the role it needs. Public ones are
# the login page and the health and metrics endpoints (the latter has its own token check).
PAGES = {  # name: (url kwargs, method, role)
    "home": ({}, "get", "viewer"),
    "overview-rows": ({}, "get", "viewer"),
    "audit": ({}, "get", "viewer"),
    "pipeline": ({"name": "orders"}, "get", "viewer"),
    "pipeline-status": ({"name": "orders"}, "get", "viewer"),
    "pipeline-now": ({"name": "orders"}, "get", "viewer"),
    "pipeline-diff": ({"name": "orders"}, "get", "viewer"),
    "pipeline-control": ({"name": "orders", "action": "restart"}, "post", "operator"),
    "pipeline-rollback": ({"name": "orders"}, "post", "operator"),
    "pipeline-restore-point-take": ({"name": "orders"}, "post", "operator"),
    "pipeline-restore-point-delete": ({"name": "orders", "point": 1}, "post", "operator"),
    "pipeline-restore": ({"name": "orders"}, "post", "operator"),
    "pipeline-offsets-reset": ({"name": "orders"}, "post", "operator"),
    "pipeline-dead-letters": ({"name": "orders"}, "get", "operator"),
    "pipeline-dead-letters-redrive": ({"name": "orders"}, "post", "operator"),
    "connections": ({}, "get", "viewer"),
    "alerts": ({}, "get", "viewer"),
    "alert-acknowledge": ({"alert_id": 1}, "post", "operator"),
    "alert-rule-silence": ({"name": "gave-up"}, "post", "operator"),
    "applications": ({}, "get", "viewer"),
    "application": ({"name": "shared"}, "get", "viewer"),
    "application-control": ({"name": "shared", "action": "start"}, "post", "operator"),
    "pipeline-new": ({}, "get", "editor"),
    "pipeline-edit": ({"name": "orders"}, "get", "editor"),
    "connection-new": ({}, "get", "editor"),
    "connection-edit": ({"name": "events"}, "get", "editor"),
}
PUBLIC = {"login", "logout", "healthz", "prometheus"}


def _page_names(patterns, prefix="") -> set[str]:
    names = set()
    for p in patterns:
        if isinstance(p, URLResolver):
            if str(p.pattern) in ("admin/", "api/"):
                continue
            names |= _page_names(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern) and p.name:
            names.add(p.name)
    return names


def test_the_lists_cover_every_page():
    assert _page_names(get_resolver().url_patterns) == set(PAGES) | PUBLIC


ROLE_ORDER = [None, "viewer", "operator", "editor", "admin"]


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_page_sends_strangers_to_the_login_and_checks_the_role(
    django_user_model, pipeline, name
):
    from django.utils import timezone

    from controlplane.alerting.models import Alert, AlertRule
    from controlplane.definitions.models import SparkApplication

    SparkApplication.objects.create(name="shared")
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    Alert.objects.create(
        id=1, rule=rule, subject="orders", state="firing", message="m", since=timezone.now()
    )
    kwargs, method, needed = PAGES[name]
    url = reverse(name, kwargs=kwargs)
    confirm = kwargs.get("name", "")
    data = {"confirm": confirm, "reason": "role test"} if method == "post" else {}
    response = getattr(Client(), method)(url, data)
    assert response.status_code == 302
    assert response["Location"].startswith(f"{reverse('login')}?next=")
    for role in ROLE_ORDER:
        response = getattr(client_with(django_user_model, role), method)(url, data)
        if ROLE_ORDER.index(role) < ROLE_ORDER.index(needed):
            assert response.status_code == 403, role
            assert f"needs the <strong>{needed}</strong> role" in response.content.decode()
        else:
            assert response.status_code in (200, 302), (role, response.status_code)


@pytest.mark.django_db
def test_signing_in_leads_to_the_overview_with_the_user_and_role_shown(django_user_model):
    user = django_user_model.objects.create_user(username="ana", password="pw-123-long")
    set_role(user, "operator")
    client = Client()
    response = client.post(reverse("login"), {"username": "ana", "password": "wrong"})
    assert response.status_code == 200
    assert "do not match" in response.content.decode()
    response = client.post(reverse("login"), {"username": "ana", "password": "pw-123-long"})
    assert response.status_code == 302 and response["Location"] == "/"
    page = client.get("/").content.decode()
    assert "ana · operator" in page
    assert "vendor/htmx.min.js" in page  # served by the app itself
    assert client.post(reverse("logout")).status_code == 302
    assert client.get("/").status_code == 302


@pytest.fixture
def fleet(api, kafka_connection, postgres_connection):
    """Pipelines in every kind of state."""
    states = {
        "a-healthy-looking": ("running", "running"),
        "b-gave-up": ("running", "failed"),
        "c-backing-off": ("running", "backing-off"),
        "d-stopped": ("stopped", "stopped"),
        "e-suspended": ("suspended", "suspended"),
    }
    for name, (desired, status) in states.items():
        response = api.post("/api/pipelines/", {"name": name, "spec": valid_spec()}, format="json")
        assert response.status_code == 201, response.json()
        Pipeline.objects.filter(name=name).update(desired_state=desired, status=status, attempt=2)
    return states


def names_in_order(html: str) -> list[str]:
    import re

    return re.findall(r'data-pipeline="([^"]+)"', html)


def test_the_overview_puts_problems_first_and_says_so_in_words(
    django_user_model, fleet, kafka_bootstrap
):
    client = client_with(django_user_model, "viewer")
    collect(timezone.now())  # the metrics collector's round (a beat task in production)
    html = client.get("/").content.decode()
    assert re.search(r"figures from \d+(\.\d)? s ago", html)
    # Failing, then recovering, then degraded (running, but its topic does not exist, so its
    # lag is unknown), then the quiet ones by name.
    assert names_in_order(html) == [
        "b-gave-up",
        "c-backing-off",
        "a-healthy-looking",
        "d-stopped",
        "e-suspended",
    ]
    assert "✖</span> failed" in html and "gave up restarting" in html
    assert "backing off (attempt 2)" in html
    assert "the topics have no partitions" in html  # why the running one is degraded
    assert "(3) Pipelines" in html  # the tab title counts the problems


def test_the_overview_filters_and_searches_and_its_rows_refresh_alone(
    django_user_model, fleet, kafka_bootstrap
):
    client = client_with(django_user_model, "viewer")
    collect(timezone.now())
    problems = client.get("/", {"show": "problems"}).content.decode()
    assert names_in_order(problems) == ["b-gave-up", "c-backing-off", "a-healthy-looking"]
    stopped = client.get(reverse("overview-rows"), {"show": "stopped"}).content.decode()
    assert names_in_order(stopped) == ["d-stopped", "e-suspended"]
    assert "<html" not in stopped  # the partial the page polls
    found = client.get(reverse("overview-rows"), {"q": "BACK"}).content.decode()
    assert names_in_order(found) == ["c-backing-off"]
    none = client.get(reverse("overview-rows"), {"q": "zzz"}).content.decode()
    assert "No pipeline matches." in none
    assert client.get("/", {"show": "<script>"}).status_code == 200  # unknown filter: all


def test_the_overview_pages_and_sorts_a_large_fleet_from_stored_figures(django_user_model, db):
    from controlplane.definitions.models import PipelineFigures

    now = timezone.now()
    for i in range(60):
        pipeline = Pipeline.objects.create(
            name=f"p{i:02d}", spec=valid_spec(), status="running", desired_state="running"
        )
        PipelineFigures.objects.create(
            pipeline=pipeline,
            collected_at=now,
            figures=metrics.empty_figures(),
            lag_records=(i * 7) % 60,  # every value once, not in name order
            lag_status="lagging" if i == 33 else "ok",
        )
    client = client_with(django_user_model, "viewer")
    first = client.get("/", {"sort": "lag"}).content.decode()
    by_lag = sorted(range(60), key=lambda i: -((i * 7) % 60))
    assert names_in_order(first) == [f"p{i:02d}" for i in by_lag[:50]]
    assert "60 pipelines · page 1 of 2" in first and 'rel="next"' in first
    second = client.get(reverse("overview-rows"), {"sort": "lag", "page": "2"}).content.decode()
    assert names_in_order(second) == [f"p{i:02d}" for i in by_lag[50:]]
    assert 'rel="prev"' in second and 'rel="next"' not in second
    # Past the end: the last page; not a number: the first.
    assert names_in_order(client.get("/", {"sort": "lag", "page": "9"}).content.decode()) == (
        names_in_order(second)
    )
    assert "page 1 of 2" in client.get("/", {"page": "x"}).content.decode()
    # Problems first (the default): the lagging one leads; then by name.
    default = names_in_order(client.get("/").content.decode())
    assert default[:3] == ["p33", "p00", "p01"]
    assert names_in_order(client.get("/", {"sort": "name"}).content.decode())[:2] == ["p00", "p01"]


def test_the_pipeline_page_shows_controls_only_to_operators_and_they_are_audited(
    django_user_model, pipeline, kafka_bootstrap
):
    from controlplane.definitions.models import AuditEntry

    url = reverse("pipeline", kwargs={"name": "orders"})
    viewer = client_with(django_user_model, "viewer").get(url).content.decode()
    assert "On-call controls" not in viewer
    operator = client_with(django_user_model, "operator")
    page = operator.get(url).content.decode()
    assert "Start orders?" in page and "Type <code>orders</code> to confirm" in page
    # Only the controls that make sense for a stopped pipeline.
    assert "Restart orders?" not in page and "Kill orders?" not in page
    control = reverse("pipeline-control", kwargs={"name": "orders", "action": "start"})
    # Without the name typed in, nothing happens.
    response = operator.post(control, {"reason": "x", "confirm": "order"}, follow=True)
    assert "Not done: type the pipeline" in response.content.decode()
    assert Pipeline.objects.get(name="orders").desired_state == "stopped"
    response = operator.post(
        control, {"reason": "INC-7: back after the failover", "confirm": "orders"}, follow=True
    )
    assert "start of orders requested." in response.content.decode()
    assert Pipeline.objects.get(name="orders").desired_state == "running"
    entry = AuditEntry.objects.get(pipeline_name="orders", action="start")
    assert (entry.actor_name, entry.reason) == ("page-operator", "INC-7: back after the failover")
    page = operator.get(url).content.decode()
    assert "INC-7: back after the failover" in page
    assert "Start orders?" not in page and "Stop orders?" in page  # now wanted running
    audit = operator.get(reverse("audit"), {"pipeline": "orders"}).content.decode()
    assert "INC-7: back after the failover" in audit and "page-operator" in audit
    assert "desired stopped → running" in audit
    assert (
        "No actions match." in operator.get(reverse("audit"), {"actor": "nobody"}).content.decode()
    )
    # An action that does not apply says why, and changes nothing.
    now = reverse("pipeline-control", kwargs={"name": "orders", "action": "restart-now"})
    response = operator.post(now, {"confirm": "orders", "where": "control-restart-now"})
    assert response["Location"].endswith("/pipelines/orders/#control-restart-now")
    page = operator.get(url).content.decode()
    refusal = "restart-now not done: pipeline &#x27;orders&#x27; has no restart pending"
    # Said next to the control used (not offered for a pipeline without a restart pending,
    # so at the top).
    assert refusal in page


def test_a_backing_off_pipeline_counts_down_its_next_attempt(django_user_model, pipeline):
    from datetime import timedelta

    from django.utils import timezone

    Pipeline.objects.filter(name="orders").update(
        status="backing-off",
        desired_state="running",
        attempt=2,
        next_attempt_at=timezone.now() + timedelta(seconds=12),
    )
    client = client_with(django_user_model, "viewer")
    html = client.get(reverse("pipeline-status", kwargs={"name": "orders"})).content.decode()
    assert "(attempt 2 of 3, its fixed-delay policy)" in html  # the spec's policy: 3 attempts
    assert any(f"Restarts it in {s} s" in html for s in (11, 12))


def test_the_diff_page_shows_what_changed_between_versions(api, django_user_model, pipeline):
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"trigger": {"interval_seconds": 9}}}, format="json"
    )
    assert response.status_code == 200, response.json()
    client = client_with(django_user_model, "viewer")
    html = client.get(reverse("pipeline-diff", kwargs={"name": "orders"})).content.decode()
    assert "v1 → v2" in html
    assert '<span class="d-remove">-    &quot;interval_seconds&quot;: 5' in html
    assert '<span class="d-add">+    &quot;interval_seconds&quot;: 9' in html
    missing = reverse("pipeline-diff", kwargs={"name": "orders"}) + "?a=1&b=7"
    assert client.get(missing).status_code == 404
    assert "Roll back" not in html  # a viewer may not


def test_an_operator_rolls_back_from_the_diff_page(api, django_user_model, pipeline):
    from controlplane.definitions.models import AuditEntry

    v1 = Pipeline.objects.get(name="orders").spec
    api.patch(
        "/api/pipelines/orders/", {"spec": {"trigger": {"interval_seconds": 9}}}, format="json"
    )
    client = client_with(django_user_model, "operator")
    html = client.get(reverse("pipeline-diff", kwargs={"name": "orders"})).content.decode()
    assert "Roll back to v1" in html and 'name="version" value="1"' in html
    url = reverse("pipeline-rollback", kwargs={"name": "orders"})
    # Confirmed as every other state-changing control: the name typed in.
    unconfirmed = {"version": "1", "reason": "9 s was too slow", "confirm": "order"}
    page = client.post(url, unconfirmed, follow=True).content.decode()
    assert "Not rolled back: type the pipeline&#x27;s name (orders) to confirm." in page
    assert Pipeline.objects.get(name="orders").version == 2
    response = client.post(url, {**unconfirmed, "confirm": "orders"}, follow=True)
    page = response.content.decode()
    assert "orders rolled back to the spec of version 1 (now version 3)." in page
    p = Pipeline.objects.get(name="orders")
    assert (p.version, p.spec) == (3, v1)
    assert AuditEntry.objects.filter(action="rollback").get().reason == (
        "to version 1: 9 s was too slow"
    )
    # A version that is not kept: said so on the page, nothing changed.
    page = client.post(url, {"version": "8", "confirm": "orders"}, follow=True).content.decode()
    assert "Not rolled back: version: pipeline &#x27;orders&#x27; has no version 8" in page
    assert Pipeline.objects.get(name="orders").version == 3


def test_the_pipeline_page_charts_come_from_the_app_and_its_history_api(
    django_user_model, pipeline, kafka_bootstrap
):
    client = client_with(django_user_model, "viewer")
    page = client.get(reverse("pipeline", kwargs={"name": "orders"})).content.decode()
    assert "vendor/uPlot.iife.min.js" in page and "js/charts.js" in page
    assert 'data-history="/api/pipelines/orders/metrics/history/"' in page
    assert "http://" not in page.replace("http://127.0.0.1", "") and "https://" not in page
    # The charts read the history with the page's session (a viewer may).
    assert client.get("/api/pipelines/orders/metrics/history/").status_code == 200
