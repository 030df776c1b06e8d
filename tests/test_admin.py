from __future__ import annotations

import json

from controlplane.pipelines.models import Pipeline
from tests.factories import valid_spec


def test_admin_pages_render(admin_client, pipeline):
    for url in (
        "/admin/",
        "/admin/pipelines/pipeline/",
        f"/admin/pipelines/pipeline/{Pipeline.objects.get().pk}/change/",
        "/admin/connections/connection/",
        "/admin/connections/connection/add/",
        "/admin/accounts/apitoken/",
    ):
        assert admin_client.get(url).status_code == 200, url


def test_the_admin_validates_specs_and_keeps_versions(admin_client, pipeline):
    pk = Pipeline.objects.get().pk
    url = f"/admin/pipelines/pipeline/{pk}/change/"
    form = {
        "name": "orders",
        "description": "",
        "desired_state": "stopped",
        "versions-TOTAL_FORMS": "0",
        "versions-INITIAL_FORMS": "1",
        "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    }
    bad = valid_spec(trigger={"interval_seconds": -1})
    response = admin_client.post(url, {**form, "spec": json.dumps(bad)})
    assert response.status_code == 200
    assert "trigger.interval_seconds" in response.content.decode()
    good = valid_spec(trigger={"interval_seconds": 7})
    response = admin_client.post(url, {**form, "spec": json.dumps(good)})
    assert response.status_code == 302
    row = Pipeline.objects.get()
    assert row.version == 2
    assert row.spec["trigger"]["interval_seconds"] == 7


def test_the_home_page_lists_pipelines(admin_client, pipeline):
    response = admin_client.get("/")
    assert response.status_code == 200
    assert "orders" in response.content.decode()


def test_healthz_reports_the_database_and_reconciler(client, db):
    body = client.get("/healthz").json()
    assert body["database"] == "ok"
    assert body["reconciler"] == "stale"
