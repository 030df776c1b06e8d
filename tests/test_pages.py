"""Server-rendered pages: roles enforced on every page, and the overview (problems first)."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from controlplane.accounts.roles import set_role
from controlplane.pipelines.models import Pipeline
from tests.factories import valid_spec

# Every page outside the API and the Django admin, with the role it needs. Public ones are
# the login page and the health and metrics endpoints (the latter has its own token check).
PAGES = {
    "home": "viewer",
    "overview-rows": "viewer",
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


def client_with(django_user_model, role: str | None) -> Client:
    user = django_user_model.objects.create_user(username=f"page-{role}", password="pw-123-long")
    set_role(user, role)
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_page_sends_strangers_to_the_login_and_checks_the_role(django_user_model, name):
    url = reverse(name)
    response = Client().get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(f"{reverse('login')}?next=")
    response = client_with(django_user_model, None).get(url)
    assert response.status_code == 403
    assert f"needs the <strong>{PAGES[name]}</strong> role" in response.content.decode()
    assert client_with(django_user_model, PAGES[name]).get(url).status_code == 200


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
    html = client.get("/").content.decode()
    # Failing, then recovering, then degraded (running, but its topic does not exist, so its
    # lag is unknown), then the quiet ones by name.
    assert names_in_order(html) == [
        "b-gave-up",
        "c-backing-off",
        "a-healthy-looking",
        "d-stopped",
        "e-suspended",
    ]
    assert "✖</span> Failed" in html and "failed: gave up restarting" in html
    assert "backing off (attempt 2)" in html
    assert "the topics have no partitions" in html  # why the running one is degraded
    assert "(3) Pipelines" in html  # the tab title counts the problems


def test_the_overview_filters_and_searches_and_its_rows_refresh_alone(
    django_user_model, fleet, kafka_bootstrap
):
    client = client_with(django_user_model, "viewer")
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
