"""Every API endpoint refuses anonymous and badly authenticated requests with 401."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.accounts.models import ApiToken
from controlplane.urls import api_patterns

ENDPOINTS = {
    "api-root": ({}, ["get"]),
    "schema": ({}, ["get"]),
    "hosts": ({}, ["get"]),
    "connection-list": ({}, ["get", "post"]),
    "connection-detail": ({"name": "x"}, ["get", "put", "patch", "delete"]),
    "connection-test": ({"name": "x"}, ["post"]),
    "pipeline-list": ({}, ["get", "post"]),
    "pipeline-detail": ({"name": "x"}, ["get", "put", "patch", "delete"]),
    "pipeline-versions": ({"name": "x"}, ["get"]),
    "pipeline-start": ({"name": "x"}, ["post"]),
    "pipeline-stop": ({"name": "x"}, ["post"]),
    "pipeline-version": ({"name": "x", "version": 1}, ["get"]),
    "pipeline-kill": ({"name": "x"}, ["post"]),
    "pipeline-restart": ({"name": "x"}, ["post"]),
    "pipeline-suspend": ({"name": "x"}, ["post"]),
    "pipeline-resume": ({"name": "x"}, ["post"]),
    "pipeline-restart-now": ({"name": "x"}, ["post"]),
    "pipeline-reset-restarts": ({"name": "x"}, ["post"]),
    "pipeline-rollback": ({"name": "x"}, ["post"]),
    "pipeline-preflight": ({"name": "x"}, ["post"]),
    "pipeline-preflight-draft": ({}, ["post"]),
    "swagger-ui": ({}, ["get"]),
    "pipeline-bulk": ({}, ["post"]),
    "pipeline-offsets": ({"name": "x"}, ["get"]),
    "pipeline-offsets-reset": ({"name": "x"}, ["post"]),
    "pipeline-restore-points": ({"name": "x"}, ["get", "post"]),
    "pipeline-delete-restore-point": ({"name": "x", "point": "1"}, ["delete"]),
    "pipeline-restore": ({"name": "x"}, ["post"]),
    "pipeline-dead-letters": ({"name": "x"}, ["get"]),
    "pipeline-dead-letters-batches": ({"name": "x"}, ["get"]),
    "pipeline-dead-letters-download": ({"name": "x"}, ["get"]),
    "pipeline-dead-letters-redrive": ({"name": "x"}, ["post"]),
    "pipeline-runs": ({"name": "x"}, ["get"]),
    "pipeline-failures": ({"name": "x"}, ["get"]),
    "pipeline-metrics": ({"name": "x"}, ["get"]),
    "pipeline-metrics-history": ({"name": "x"}, ["get"]),
    "pipeline-metrics-state": ({"name": "x"}, ["get"]),
    "pipeline-writer-schemas": ({"name": "x"}, ["get"]),
    "pipeline-checkpoints": ({"name": "x"}, ["get"]),
    "application-list": ({}, ["get", "post"]),
    "application-detail": ({"name": "x"}, ["get", "put", "patch", "delete"]),
    "application-start": ({"name": "x"}, ["post"]),
    "application-stop": ({"name": "x"}, ["post"]),
    "application-recycle": ({"name": "x"}, ["post"]),
    "application-exit": ({"name": "x"}, ["post"]),
    "application-reports": ({"name": "x"}, ["post"]),
    "audit-list": ({}, ["get"]),
    "alert-channel-list": ({}, ["get", "post"]),
    "alert-channel-detail": ({"name": "x"}, ["get", "put", "patch", "delete"]),
    "alert-rule-list": ({}, ["get", "post"]),
    "alert-rule-detail": ({"name": "x"}, ["get", "put", "patch", "delete"]),
    "alert-rule-silence": ({"name": "x"}, ["post"]),
    "alert-rule-unsilence": ({"name": "x"}, ["post"]),
    "alert-list": ({}, ["get"]),
    "alert-detail": ({"pk": 1}, ["get"]),
    "alert-acknowledge": ({"pk": 1}, ["post"]),
    "audit-detail": ({"pk": 1}, ["get"]),
    "run-heartbeat": ({"run_id": 1}, ["post"]),
    "run-progress": ({"run_id": 1}, ["post"]),
    "run-exit": ({"run_id": 1}, ["post"]),
    "apply": ({}, ["post"]),
    "export": ({}, ["get"]),
    "fleet": ({}, ["get"]),
    "fleet-schema": ({}, ["get"]),
}
# Drivers (and shared applications' supervisors) authenticate with their own token, people
# and scripts with API tokens.
RUN_ENDPOINTS = {
    "run-heartbeat",
    "run-progress",
    "run-exit",
    "application-exit",
    "application-reports",
}


def test_the_list_below_covers_every_api_route():
    names = {p.name for p in api_patterns if p.name}
    assert names == set(ENDPOINTS)


def _requests():
    for name, (kwargs, methods) in ENDPOINTS.items():
        for method in methods:
            yield pytest.param(name, kwargs, method, id=f"{method}-{name}")


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "kwargs", "method"), list(_requests()))
def test_anonymous_requests_get_401(anon, name, kwargs, method):
    response = getattr(anon, method)(reverse(f"api:{name}", kwargs=kwargs), {}, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == ("RunToken" if name in RUN_ENDPOINTS else "Token")


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "kwargs", "method"), list(_requests()))
def test_a_wrong_token_gets_401(anon, name, kwargs, method):
    anon.credentials(HTTP_AUTHORIZATION="Token cpt_not-a-real-token")
    response = getattr(anon, method)(reverse(f"api:{name}", kwargs=kwargs), {}, format="json")
    assert response.status_code == 401


def test_a_valid_token_is_accepted_and_its_use_recorded(api, user):
    assert api.get("/api/pipelines/").status_code == 200
    assert ApiToken.objects.get(user=user).last_used_at is not None


def test_a_revoked_token_is_refused(api, user):
    ApiToken.objects.filter(user=user).update(revoked_at=timezone.now())
    assert api.get("/api/pipelines/").status_code == 401


def test_tokens_of_inactive_users_are_refused(api, user):
    user.is_active = False
    user.save()
    assert api.get("/api/pipelines/").status_code == 401


def test_only_a_digest_of_the_token_is_stored(token, user):
    row = ApiToken.objects.get(user=user)
    assert token not in (row.key_digest, row.hint)
    assert len(row.key_digest) == 64


# The role each request needs (controlplane.accounts.roles), stated here independently of the
# views: reading is for viewers, on-call controls for operators, changes for editors.
OPERATOR_ACTIONS = {
    "pipeline-start",
    "pipeline-stop",
    "pipeline-kill",
    "pipeline-restart",
    "pipeline-suspend",
    "pipeline-resume",
    "pipeline-restart-now",
    "pipeline-reset-restarts",
    "pipeline-rollback",  # brings back a spec that was accepted, checked again
    "pipeline-preflight",  # the stored definition against its systems, before a start
    "pipeline-bulk",
    "pipeline-offsets-reset",
    "pipeline-restore-points",  # taking one (reading: viewers)
    "pipeline-delete-restore-point",
    "pipeline-restore",
    "pipeline-dead-letters-redrive",
    "connection-test",
    "application-start",
    "application-stop",
    "application-recycle",
    "alert-rule-silence",
    "alert-rule-unsilence",
    "alert-acknowledge",
}
# Shared applications' definitions choose resources and Spark settings: admins only.
# So do alert channels: they say where the control plane sends its messages.
ADMIN_WRITES = {
    "application-list",
    "application-detail",
    "alert-channel-list",
    "alert-channel-detail",
}


# Reading that shows records' raw values: operators.
OPERATOR_READS = {"pipeline-dead-letters", "pipeline-dead-letters-download"}


def needed_role(name: str, method: str) -> str:
    if method == "get":
        return "operator" if name in OPERATOR_READS else "viewer"
    if name in OPERATOR_ACTIONS:
        return "operator"
    if name in ADMIN_WRITES:
        return "admin"
    return "editor"


def _role_requests():
    for name, (kwargs, methods) in ENDPOINTS.items():
        if name in RUN_ENDPOINTS:
            continue
        for method in methods:
            for role in (None, "viewer", "operator", "editor", "admin"):
                yield pytest.param(name, kwargs, method, role, id=f"{role}-{method}-{name}")


ROLE_ORDER = [None, "viewer", "operator", "editor", "admin"]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "kwargs", "method", "role"), list(_role_requests()))
def test_every_endpoint_enforces_its_role(anon, django_user_model, name, kwargs, method, role):
    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username=f"u-{role}")
    set_role(user, role)
    _, key = ApiToken.issue(user, "t")
    anon.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    response = getattr(anon, method)(reverse(f"api:{name}", kwargs=kwargs), {}, format="json")
    needed = needed_role(name, method)
    if ROLE_ORDER.index(role) >= ROLE_ORDER.index(needed):
        assert response.status_code not in (401, 403), response.content
    else:
        assert response.status_code == 403
        said = re.sub(rb"</?strong>", b"", response.content)  # the Swagger UI's page is HTML
        assert f"needs the {needed} role".encode() in said


def test_prometheus_metrics_need_a_viewer(anon, django_user_model):
    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username="scraper")
    _, key = ApiToken.issue(user, "prometheus")
    anon.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert anon.get("/metrics").status_code == 403
    set_role(user, "viewer")
    assert anon.get("/metrics").status_code == 200


def test_a_superuser_is_an_admin_and_roles_are_groups(django_user_model):
    from controlplane.accounts.roles import has_role, role_of, set_role

    root = django_user_model.objects.create_superuser(username="root", password="x-1-long-pw")
    assert role_of(root) == "admin"
    user = django_user_model.objects.create_user(username="someone")
    assert role_of(user) is None
    set_role(user, "operator")
    user = django_user_model.objects.get(pk=user.pk)
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]
    assert has_role(user, "viewer") and has_role(user, "operator")
    assert not has_role(user, "editor")
