"""Rolling a pipeline back to an earlier version: a new version equal to it, audited; a
running pipeline is restarted so that the older spec runs."""

from __future__ import annotations

import pytest

from controlplane.accounts.roles import OPERATOR, VIEWER
from controlplane.definitions.models import AuditEntry, Pipeline, Run
from tests.clients import client_as


@pytest.fixture
def three_versions(api, pipeline):
    for interval in (7, 9):
        response = api.patch(
            "/api/pipelines/orders/",
            {"spec": {"trigger": {"interval_seconds": interval}}},
            format="json",
        )
        assert response.status_code == 200, response.json()
    assert Pipeline.objects.get(name="orders").version == 3
    return [
        v["spec"] for v in reversed(api.get("/api/pipelines/orders/versions/").json()["results"])
    ]


def test_a_rollback_makes_an_earlier_spec_current_as_a_new_version(
    django_user_model, three_versions
):
    operator = client_as(django_user_model, OPERATOR)
    response = operator.post(
        "/api/pipelines/orders/rollback/", {"version": 1, "reason": "bad deploy"}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["version"] == 4
    assert body["spec"] == three_versions[0]
    pipeline = Pipeline.objects.get(name="orders")
    assert pipeline.spec == three_versions[0] and pipeline.trigger_seconds not in (7, 9)
    entry = AuditEntry.objects.filter(pipeline_name="orders").first()
    assert (entry.action, entry.actor_name) == ("rollback", "r-operator")
    assert entry.reason == "to version 1: bad deploy"
    assert (entry.before["version"], entry.after["version"]) == (3, 4)

    # Rolling back to what is current already changes nothing.
    again = operator.post("/api/pipelines/orders/rollback/", {"version": 1}, format="json")
    assert again.status_code == 200 and again.json()["version"] == 4
    assert AuditEntry.objects.filter(action="rollback").count() == 1


def test_a_rollback_is_refused_with_the_field_and_the_reason(django_user_model, api, pipeline):
    response = api.post("/api/pipelines/orders/rollback/", {"version": 9}, format="json")
    assert response.status_code == 400
    assert response.json() == {"version": ["pipeline 'orders' has no version 9 (kept: 1)"]}
    response = api.post("/api/pipelines/orders/rollback/", {"version": "x"}, format="json")
    assert response.status_code == 400 and "version" in response.json()
    viewer = client_as(django_user_model, VIEWER)
    response = viewer.post("/api/pipelines/orders/rollback/", {"version": 1}, format="json")
    assert response.status_code == 403
    assert Pipeline.objects.get(name="orders").version == 1


def test_a_running_pipeline_is_restarted_to_run_the_older_spec(api, three_versions):
    pipeline = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=pipeline.pk).update(
        desired_state="running", status="running", generation=1
    )
    Run.objects.create(pipeline=pipeline, generation=1, spec_version=3, state="running")
    response = api.post("/api/pipelines/orders/rollback/", {"version": 2}, format="json")
    assert response.status_code == 200, response.json()
    pipeline.refresh_from_db()
    assert pipeline.version == 4 and pipeline.spec == three_versions[1]
    # The run of version 3 is no longer the wanted one: the reconciler stops it and starts
    # generation 2, with version 4.
    assert pipeline.generation == 2
    actions = list(
        AuditEntry.objects.filter(pipeline_name="orders").values_list("action", "reason")[:2]
    )
    assert actions == [("restart", "rollback to version 2"), ("rollback", "to version 2")]
