"""Labels on pipelines, filtering by them, and one on-call action for many pipelines."""

from __future__ import annotations

import pytest

from controlplane.definitions.models import AuditEntry, Pipeline
from tests.clients import client_as
from tests.factories import valid_spec


@pytest.fixture
def fleet(api, kafka_connection, postgres_connection):
    for name, labels in (
        ("pay-a", {"team": "payments", "domain": "orders"}),
        ("pay-b", {"team": "payments"}),
        ("ship-a", {"team": "shipping"}),
    ):
        body = {"name": name, "spec": valid_spec(), "labels": labels}
        response = api.post("/api/pipelines/", body, format="json")
        assert response.status_code == 201, response.json()
        assert response.json()["labels"] == labels


def names(response) -> list[str]:
    return [p["name"] for p in response.json()["results"]]


def test_pipelines_are_filtered_by_their_labels(api, fleet):
    assert names(api.get("/api/pipelines/?label=team:payments")) == ["pay-a", "pay-b"]
    both = "/api/pipelines/?label=team:payments&label=domain=orders"
    assert names(api.get(both)) == ["pay-a"]
    assert names(api.get("/api/pipelines/?label=team:nobody")) == []
    response = api.get("/api/pipelines/?label=team")
    assert response.status_code == 400
    assert response.json() == {"label": ["'team' is not name:value (e.g. team:payments)"]}


def test_labels_are_changed_by_editors_checked_and_audited(api, fleet):
    response = api.patch("/api/pipelines/pay-b/", {"labels": {"team": "risk"}}, format="json")
    assert response.status_code == 200 and response.json()["labels"] == {"team": "risk"}
    entry = AuditEntry.objects.filter(pipeline_name="pay-b", action="update").get()
    assert (entry.before["labels"], entry.after["labels"]) == (
        {"team": "payments"},
        {"team": "risk"},
    )
    name_rule = (
        "a label's name is 1-63 lower-case letters, digits, '_', '.' or '-', starting with a"
        " letter or digit"
    )
    value_rule = "a label's value is a string of up to 63 letters, digits, '_', '.', '-'"
    for bad, problem in (
        (["team"], {"labels": ['must be an object of names to values, e.g. {"team": "payments"}']}),
        ({"Team": "x"}, {"labels.Team": [name_rule]}),
        ({"team": 3}, {"labels.team": [value_rule]}),
        ({f"k{i}": "v" for i in range(21)}, {"labels": ["at most 20 labels"]}),
    ):
        response = api.patch("/api/pipelines/pay-b/", {"labels": bad}, format="json")
        assert (response.status_code, response.json()) == (400, problem), bad
    assert Pipeline.objects.get(name="pay-b").labels == {"team": "risk"}


def test_one_action_for_every_pipeline_with_a_label_each_audited(django_user_model, fleet):
    operator = client_as(django_user_model, "operator")
    body = {"action": "start", "labels": ["team:payments"], "reason": "INC-7 back up"}
    response = operator.post("/api/pipelines/bulk/", body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {"action": "start", "done": ["pay-a", "pay-b"], "refused": {}}
    desired = dict(Pipeline.objects.values_list("name", "desired_state"))
    assert desired == {"pay-a": "running", "pay-b": "running", "ship-a": "stopped"}
    entries = AuditEntry.objects.filter(action="start").order_by("pipeline_name")
    assert [(e.pipeline_name, e.reason) for e in entries] == [
        ("pay-a", "INC-7 back up"), ("pay-b", "INC-7 back up"),
    ]  # fmt: skip

    # By name; what cannot be done to one is said, the others are done.
    body = {"action": "resume", "names": ["pay-a", "ship-a"]}
    response = operator.post("/api/pipelines/bulk/", body, format="json").json()
    assert response["done"] == ["pay-a"]  # running already: nothing to do, done
    assert response["refused"] == {
        "ship-a": "pipeline 'ship-a' is stopped, not suspended: start it"
    }


def test_bulk_requests_are_checked(django_user_model, api, fleet):
    operator = client_as(django_user_model, "operator")
    which = "say which pipelines: names, or labels, or both"
    not_a_selector = "'team' is not name:value (e.g. team:payments)"
    for body, errors in (
        ({"action": "start"}, {"non_field_errors": [which]}),
        ({"action": "delete", "names": ["pay-a"]}, {"action": ['"delete" is not a valid choice.']}),
        ({"action": "stop", "names": ["pay-a", "nope"]}, {"names": ["no pipeline named nope"]}),
        ({"action": "stop", "labels": ["team"]}, {"labels": [not_a_selector]}),
    ):
        response = operator.post("/api/pipelines/bulk/", body, format="json")
        assert (response.status_code, response.json()) == (400, errors)
    viewer = client_as(django_user_model, "viewer")
    response = viewer.post(
        "/api/pipelines/bulk/", {"action": "stop", "names": ["pay-a"]}, format="json"
    )
    assert response.status_code == 403
    assert set(Pipeline.objects.values_list("desired_state", flat=True)) == {"stopped"}


def test_bulk_is_not_a_pipeline_name(api, kafka_connection, postgres_connection):
    response = api.post("/api/pipelines/", {"name": "bulk", "spec": valid_spec()}, format="json")
    assert response.status_code == 400
    assert response.json() == {"name": ["'bulk' is reserved (the API's /api/pipelines/bulk/)"]}


def test_the_overview_filters_by_a_label_and_shows_labels(django_user_model, fleet):
    import re

    from django.test import Client

    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username="v", password="x-not-used-1")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)
    html = client.get("/?label=team:payments").content.decode()
    assert re.findall(r'data-pipeline="([^"]+)"', html) == ["pay-a", "pay-b"]
    assert '<span class="label">domain:orders</span>' in html
    html = client.get("/?label=team").content.decode()
    assert "&#x27;team&#x27; is not name:value (e.g. team:payments)" in html
    rows = client.get("/pipelines/rows?label=team:shipping").content.decode()
    assert re.findall(r'data-pipeline="([^"]+)"', rows) == ["ship-a"]
