from __future__ import annotations

import json

from controlplane.definitions.models import Pipeline
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


def test_moving_a_connection_in_the_admin_drops_its_password_and_is_audited(admin_client, db):
    from controlplane.connections.models import Connection
    from controlplane.definitions.models import AuditEntry

    form = {
        "name": "dw",
        "kind": "postgres",
        "description": "",
        "settings": json.dumps({"dsn": "postgresql://app@db:5432/dw"}),
        "secret_password": "pw-admin-1",
    }
    response = admin_client.post("/admin/connections/connection/add/", form)
    assert response.status_code == 302, response.content.decode()[-2000:]
    connection = Connection.objects.get(name="dw")
    assert connection.get_secrets() == {"password": "pw-admin-1"}
    moved = {**form, "settings": json.dumps({"dsn": "postgresql://app@elsewhere:5432/dw"})}
    del moved["secret_password"]
    response = admin_client.post(
        f"/admin/connections/connection/{connection.pk}/change/", moved, follow=True
    )
    assert "its stored password was removed" in response.content.decode()
    assert Connection.objects.get(name="dw").get_secrets() == {}
    entries = AuditEntry.objects.filter(connection_name="dw").order_by("id")
    assert [(e.action, e.after.get("secrets_dropped")) for e in entries] == [
        ("connection-create", None),
        ("connection-update", ["password"]),
    ]
    # The control plane's own database is refused here too.
    from django.db import connection as db

    own = db.settings_dict
    refused = {
        **form,
        "name": "own",
        "settings": json.dumps(
            {"dsn": f"postgresql://x@{own['HOST']}:{own['PORT']}/{own['NAME']}"}
        ),
    }
    response = admin_client.post("/admin/connections/connection/add/", refused)
    assert response.status_code == 200  # the form again, with the problem
    assert "control plane&#x27;s own database" in response.content.decode()
    assert not Connection.objects.filter(name="own").exists()
