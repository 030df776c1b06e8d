"""Definitions as code against a real control plane (its Postgres): plan and apply through
POST /api/apply/, idempotence, all or nothing, prune, drift, export round trips, and every
refusal named by file and path."""

from __future__ import annotations

import pytest

from controlplane.connections.models import Connection
from controlplane.definitions.models import ManagedObject, Pipeline

PASSWORD = "fleet-pw-Zq81"

CONNECTIONS = """
apiVersion: controlplane/v1
kind: Connection
name: events
description: the shop's cluster
spec:
  kind: kafka
  settings: {bootstrap_servers: ["kafka-1:9092"]}
---
apiVersion: controlplane/v1
kind: Connection
name: warehouse
spec:
  kind: postgres
  settings: {dsn: "postgresql://app@db.internal:5432/sales"}
  secrets: {password: {env: FLEET_SECRET_WAREHOUSE}}
"""

ORDERS = """
apiVersion: controlplane/v1
kind: PipelineTemplate
name: orders
labels: {team: shop}
spec:
  parameters:
    topic: {type: string}
    interval: {type: integer, default: 5}
  deployment: {restore_point_minutes: 60}
  pipeline:
    source:
      kind: kafka
      connection: events
      topics: ["${params.topic}"]
      format: json
      schema: "id STRING, amount DOUBLE, ts TIMESTAMP"
    sink:
      {kind: postgres, connection: warehouse, table: "t_${params.topic}", mode: upsert, key: [id]}
    trigger: {interval_seconds: "${params.interval}"}
  instances:
    - {name: orders-eu, parameters: {topic: eu}}
    - {name: orders-us, parameters: {topic: us}}
    - {name: orders-ap, parameters: {topic: ap, interval: 10}}
"""

FILES = {"fleet/connections.yaml": CONNECTIONS, "fleet/orders.yaml": ORDERS}


@pytest.fixture
def user(db, django_user_model):
    """An admin (the `api` fixture's user): these files' connections read their secrets from
    the control plane, which only an admin may have an apply do."""
    from controlplane.accounts.roles import ADMIN, set_role

    user = django_user_model.objects.create_user(username="oncall", password="not-used-here-1")
    set_role(user, ADMIN)
    return user


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("FLEET_SECRET_WAREHOUSE", PASSWORD)


def post(api, files, **options):
    body = {"fleet": options.pop("fleet", "shop"), "files": files, **options}
    return api.post("/api/apply/", body, format="json")


def actions(answer) -> dict:
    return {f"{o['kind']}/{o['name']}": o["action"] for o in answer["objects"]}


def test_plan_apply_and_apply_again(api):
    plan = post(api, FILES)
    assert plan.status_code == 200, [o.get("errors") for o in plan.json()["objects"]]
    body = plan.json()
    assert body["dry_run"] is True and body["applied"] is False
    assert actions(body) == {
        "Connection/events": "create",
        "Connection/warehouse": "create",
        "Pipeline/orders-ap": "create",
        "Pipeline/orders-eu": "create",
        "Pipeline/orders-us": "create",
    }
    assert (
        not Pipeline.objects.exists() and not Connection.objects.exists()
    )  # a plan writes nothing
    assert PASSWORD not in plan.content.decode()

    applied = post(api, FILES, dry_run=False, repository="git@example:shop", commit="a" * 40)
    assert applied.status_code == 200, applied.json()
    assert applied.json()["summary"]["create"] == 5
    assert Connection.objects.get(name="warehouse").get_secrets() == {"password": PASSWORD}
    eu = Pipeline.objects.get(name="orders-eu")
    assert eu.labels == {"team": "shop", "template": "orders"}
    assert eu.restore_point_minutes == 60
    assert eu.spec["sink"]["table"] == "t_eu"
    version = eu.versions.get()
    assert version.source == {
        "fleet": "shop",
        "repository": "git@example:shop",
        "commit": "a" * 40,
        "path": "fleet/orders.yaml",
        "document": 1,
        "template": "orders",
    }
    assert version.created_by.username == "oncall"
    row = ManagedObject.objects.get(kind="Pipeline", name="orders-eu")
    assert row.fleet == "shop" and row.source["path"] == "fleet/orders.yaml"

    again = post(api, FILES, dry_run=False)
    assert again.status_code == 200
    assert set(actions(again.json()).values()) == {"unchanged"}
    assert Pipeline.objects.get(name="orders-eu").version == 1


def test_export_applied_to_an_empty_control_plane_exports_the_same_bytes(api):
    assert post(api, FILES, dry_run=False).status_code == 200
    first = api.get("/api/export/", {"fleet": "shop"}).json()
    assert sorted(first["files"]) == [
        "connections/events.yaml",
        "connections/warehouse.yaml",
        "pipelines/orders-ap.yaml",
        "pipelines/orders-eu.yaml",
        "pipelines/orders-us.yaml",
    ]
    assert "FLEET_SECRET_WAREHOUSE" in first["files"]["connections/warehouse.yaml"]
    assert PASSWORD not in str(first)
    # The exported files are already what is there: unchanged everywhere.
    same = post(api, first["files"])
    assert set(actions(same.json()).values()) == {"unchanged"}, same.json()
    # An empty control plane.
    Pipeline.objects.all().delete()
    Connection.objects.all().delete()
    ManagedObject.objects.all().delete()
    created = post(api, first["files"], dry_run=False)
    assert created.status_code == 200, created.json()
    assert set(actions(created.json()).values()) == {"create"}
    second = api.get("/api/export/", {"fleet": "shop"}).json()
    assert second["files"] == first["files"]  # byte for byte
    assert set(actions(post(api, second["files"]).json()).values()) == {"unchanged"}


def test_one_refused_object_in_fifty_leaves_nothing_applied(api):
    instances = "\n".join(
        f"    - {{name: p{i:02d}, parameters: {{topic: t{i}}}}}" for i in range(48)
    )
    files = {
        "fleet/connections.yaml": CONNECTIONS,
        "fleet/orders.yaml": ORDERS.split("  instances:")[0] + "  instances:\n" + instances,
        "fleet/bad.yaml": (
            "apiVersion: controlplane/v1\nkind: Pipeline\nname: bad\n"
            "spec: {source: {kind: kafka, connection: events, topics: [x], format: json,"
            " schema: 'id STRING'}, sink: {kind: postgres, connection: nowhere, table: t}}\n"
        ),
    }
    answer = post(api, files, dry_run=False)
    assert answer.status_code == 400
    body = answer.json()
    assert body["applied"] is False and body["summary"]["refused"] == 1
    assert body["summary"]["create"] == 50  # what the others would have been
    bad = next(o for o in body["objects"] if o["name"] == "bad")
    assert bad["file"] == "fleet/bad.yaml" and bad["document"] == 1
    assert [e["path"] for e in bad["errors"]] == ["spec.sink.connection"]
    assert "no connection named 'nowhere'" in bad["errors"][0]["message"]
    assert not Pipeline.objects.exists()
    assert not Connection.objects.exists()
    assert not ManagedObject.objects.exists()


def test_every_refusal_names_its_file_and_path(api, monkeypatch):
    monkeypatch.delenv("FLEET_SECRET_WAREHOUSE")
    files = {
        "fleet/connections.yaml": CONNECTIONS.replace(
            "settings: {bootstrap_servers", "settings: {nonsense: 1, bootstrap_servers"
        )
        + """---
apiVersion: controlplane/v1
kind: Connection
name: leaky
spec:
  kind: postgres
  settings: {dsn: "postgresql://app:hunter2@db:5432/x"}
---
apiVersion: controlplane/v1
kind: Connection
name: greedy
spec:
  kind: postgres
  settings: {dsn: "postgresql://app@db:5432/x"}
  secrets: {password: {env: DATABASE_URL}}
""",
        "fleet/orders.yaml": ORDERS.replace("table: ", "tabel: "),
    }
    answer = post(api, files)
    assert answer.status_code == 400
    body = answer.json()
    errors = {
        f"{o['file']}#{o['document']} {e['path']}": e["message"]
        for o in body["objects"]
        for e in o.get("errors", [])
    }
    assert "fleet/connections.yaml#1 spec.settings.nonsense" in errors
    assert errors["fleet/connections.yaml#2 spec.secrets.password"] == (
        "env: FLEET_SECRET_WAREHOUSE is not set in the control plane's environment"
    )
    assert "holds a secret (password)" in errors["fleet/connections.yaml#3 spec.settings"]
    assert (
        "does not begin with 'FLEET_SECRET_'"
        in errors["fleet/connections.yaml#4 spec.secrets.password"]
    )
    assert "hunter2" not in str(body)
    # A template instance's problem is at the template's path.
    assert "fleet/orders.yaml#1 spec.pipeline.sink.tabel" in errors
    assert "fleet/orders.yaml#1 spec.pipeline.sink.table" in errors
    # The files' own problems come first, each with its file, document and path.
    broken = {"fleet/orders.yaml": ORDERS.replace("interval: 10}", "interval: ten}")}
    answer = post(api, broken)
    assert answer.status_code == 400
    assert answer.json()["errors"] == [
        {
            "file": "fleet/orders.yaml",
            "document": "document 1 (PipelineTemplate orders)",
            "path": "spec.instances[2].parameters.interval",
            "message": "must be an integer",
        }
    ]
    assert answer.json()["objects"] == []


def test_prune_deletes_only_the_fleets_own_objects(api):
    assert post(api, FILES, dry_run=False).status_code == 200
    # Another pipeline, made through the API (no fleet's), on the same connections.
    made = api.post(
        "/api/pipelines/",
        {"name": "by-hand", "spec": Pipeline.objects.get(name="orders-eu").spec},
        format="json",
    )
    assert made.status_code == 201, made.json()
    fewer = {
        **FILES,
        "fleet/orders.yaml": ORDERS.replace(
            "    - {name: orders-ap, parameters: {topic: ap, interval: 10}}\n", ""
        ),
    }
    kept = post(api, fewer, dry_run=False).json()
    assert actions(kept)["Pipeline/orders-ap"] == "left"  # without prune: kept
    assert Pipeline.objects.filter(name="orders-ap").exists()
    plan = post(api, fewer, prune=True).json()
    assert actions(plan)["Pipeline/orders-ap"] == "delete"
    assert "Pipeline/by-hand" not in actions(plan)
    pruned = post(api, fewer, dry_run=False, prune=True)
    assert pruned.status_code == 200, pruned.json()
    assert sorted(Pipeline.objects.values_list("name", flat=True)) == [
        "by-hand",
        "orders-eu",
        "orders-us",
    ]
    assert not ManagedObject.objects.filter(name="orders-ap").exists()
    # Another fleet cannot take an object this one manages.
    other = post(api, {"f.yaml": CONNECTIONS}, fleet="other").json()
    assert {e["message"] for o in other["objects"] for e in o.get("errors", [])} == {
        "Connection/events is managed by fleet 'shop'",
        "Connection/warehouse is managed by fleet 'shop'",
    }


def test_a_change_through_the_api_is_drift_the_next_plan_shows(api):
    assert post(api, FILES, dry_run=False).status_code == 200
    assert api.get("/api/fleet/", {"drifted": "true"}).json()["count"] == 0
    patched = api.patch(
        "/api/pipelines/orders-us/", {"labels": {"team": "ops"}, "placement": "auto"}, format="json"
    )
    assert patched.status_code == 200, patched.json()
    fleet = api.get("/api/fleet/", {"drifted": "true"}).json()
    assert fleet["count"] == 1
    (row,) = fleet["results"]
    assert row["kind"] == "Pipeline" and row["name"] == "orders-us" and row["fleet"] == "shop"
    assert {"path": "labels.team", "before": "shop", "after": "ops"} in row["drifted"]
    assert {"path": "deployment.placement", "after": "auto"} in row["drifted"]
    assert row["source"]["path"] == "fleet/orders.yaml"
    # The periodic check marks it (what Prometheus and the alert rule read).
    from django.utils import timezone

    from controlplane.fleet import drift

    assert drift.check(timezone.now()) == {"drifted": 1, "cleared": 0}
    assert ManagedObject.objects.get(name="orders-us").drifted_at is not None
    plan = post(api, FILES).json()
    us = next(o for o in plan["objects"] if o["name"] == "orders-us")
    assert us["action"] == "update"
    assert {"path": "labels.team", "before": "shop", "after": "ops"} in us["drifted"]
    assert {"path": "labels.team", "before": "ops", "after": "shop"} in us["changes"]
    assert post(api, FILES, dry_run=False).status_code == 200
    assert api.get("/api/fleet/", {"drifted": "true"}).json()["count"] == 0
    assert ManagedObject.objects.get(name="orders-us").drifted_at is None  # applied again
    assert drift.check(timezone.now()) == {"drifted": 0, "cleared": 0}
    # A secret changed through the API is drift too (its value never shown).
    api.patch("/api/connections/warehouse/", {"secrets": {"password": "other"}}, format="json")
    (row,) = api.get("/api/fleet/", {"drifted": "true"}).json()["results"]
    assert row["drifted"] == [{"path": "secrets", "message": "changed since it was last applied"}]
    plan = post(api, FILES).json()
    warehouse = next(o for o in plan["objects"] if o["name"] == "warehouse")
    assert warehouse["action"] == "update"
    assert warehouse["secrets_changed"] == ["secrets.password"]


def test_a_template_change_updates_each_instance_and_restarts_the_running_ones(api):
    from tests.runs import with_current_run

    assert post(api, FILES, dry_run=False).status_code == 200
    with_current_run(Pipeline.objects.get(name="orders-eu"))
    with_current_run(Pipeline.objects.get(name="orders-ap"))
    changed = {**FILES, "fleet/orders.yaml": ORDERS.replace("default: 5", "default: 7")}
    plan = post(api, changed).json()
    # orders-ap sets its own interval: only the two on the default change.
    assert {o["name"]: o["action"] for o in plan["objects"] if o["kind"] == "Pipeline"} == {
        "orders-eu": "update",
        "orders-us": "update",
        "orders-ap": "unchanged",
    }
    eu = next(o for o in plan["objects"] if o["name"] == "orders-eu")
    assert eu["changes"] == [{"path": "spec.trigger.interval_seconds", "before": 5, "after": 7}]
    assert eu["restart"] is True and eu["restore_point"] is False
    us = next(o for o in plan["objects"] if o["name"] == "orders-us")
    assert us["restart"] is False
    assert Pipeline.objects.get(name="orders-eu").generation == 1  # the plan did nothing
    applied = post(api, changed, dry_run=False)
    assert applied.status_code == 200, applied.json()
    eu, us, ap = (Pipeline.objects.get(name=n) for n in ("orders-eu", "orders-us", "orders-ap"))
    assert (eu.version, eu.generation, eu.status) == (2, 2, "restarting")
    assert (us.version, us.generation) == (2, 0)
    assert (ap.version, ap.generation) == (1, 1)
    assert eu.audit.filter(action="restart").get().reason.startswith("applied from files")


ALERTING = """
apiVersion: controlplane/v1
kind: AlertChannel
name: oncall-hook
spec:
  kind: webhook
  target: {env: FLEET_SECRET_HOOK_URL}
  signing_key: {file: hook-key}
---
apiVersion: controlplane/v1
kind: AlertRule
name: eu-stuck
spec:
  kind: no-commit
  params: {minutes: 15}
  pipeline: orders-eu
  channels: [oncall-hook]
---
apiVersion: controlplane/v1
kind: SparkApplication
name: small-jobs
description: the shop's shared application
spec: {driver_memory: 1g, capacity: 10, conf: {spark.sql.shuffle.partitions: 4}}
"""


def test_applications_alerting_and_secrets_need_an_admin_and_come_from_the_store(
    api, django_user_model, monkeypatch, settings, tmp_path
):
    from controlplane.alerting.models import AlertChannel, AlertRule
    from controlplane.definitions.models import SparkApplication
    from tests.clients import client_as

    hook = "https://hooks.example.com/alerts?token=sEcReTpAtH"
    monkeypatch.setenv("FLEET_SECRET_HOOK_URL", hook)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "hook-key").write_text("signing-key-9\n")
    settings.CONTROLPLANE_FLEET_SECRETS_DIR = str(tmp_path / "store")
    files = {**FILES, "fleet/alerting.yaml": ALERTING}
    # An editor may not create what only admins define, nor have the control plane's
    # secrets put into a connection (it could point one at a server of its own): refused.
    editor = client_as(django_user_model, "editor")
    body = post(editor, files, dry_run=False).json()
    refused = {o["name"]: o["errors"] for o in body["objects"] if o["action"] == "refused"}
    missing = "no connection named 'warehouse' (known: events)"
    assert refused == {
        "warehouse": [
            {
                "path": "kind",
                "message": "creating a Connection whose secrets the control plane keeps needs"
                " the admin role",
            }
        ],
        "small-jobs": [
            {"path": "kind", "message": "creating a SparkApplication needs the admin role"}
        ],
        "oncall-hook": [
            {
                "path": "kind",
                "message": "creating an AlertChannel whose secrets the control plane keeps"
                " needs the admin role",
            }
        ],
        **{
            name: [{"path": "spec.pipeline.sink.connection", "message": missing}]
            for name in ("orders-eu", "orders-us", "orders-ap")
        },
        # What names what was refused is refused too, by the API's own validator.
        "eu-stuck": [
            {"path": "spec.pipeline", "message": "Object with name=orders-eu does not exist."},
            {"path": "spec.channels", "message": "Object with name=oncall-hook does not exist."},
        ],
    }
    assert not Pipeline.objects.exists()
    applied = post(api, files, dry_run=False)  # an admin's
    assert applied.status_code == 200, applied.json()
    # Once there, the same files are the editor's to plan and apply (unchanged), and to
    # change a pipeline in.
    assert set(actions(post(editor, files).json()).values()) == {"unchanged"}
    changed = {**files, "fleet/orders.yaml": ORDERS.replace("default: 5", "default: 6")}
    assert post(editor, changed, dry_run=False).status_code == 200
    channel = AlertChannel.objects.get(name="oncall-hook")
    assert channel.get_url() == hook and channel.get_signing_key() == "signing-key-9"
    assert "sEcReTpAtH" not in channel.target and "sEcReTpAtH" not in applied.content.decode()
    rule = AlertRule.objects.get(name="eu-stuck")
    assert rule.pipeline.name == "orders-eu" and [c.name for c in rule.channels.all()] == [
        "oncall-hook"
    ]
    app = SparkApplication.objects.get(name="small-jobs")
    assert (app.driver_memory, app.capacity, app.conf) == (
        "1g",
        10,
        {"spark.sql.shuffle.partitions": "4"},
    )
    admin = api
    assert set(actions(post(admin, changed).json()).values()) == {"unchanged"}
    exported = admin.get("/api/export/", {"fleet": "shop"}).json()["files"]
    assert "env: FLEET_SECRET_HOOK_URL" in exported["alert-channels/oncall-hook.yaml"]
    assert "file: hook-key" in exported["alert-channels/oncall-hook.yaml"]
    # The key rotated in the store: the next plan updates the channel, showing no value.
    (tmp_path / "store" / "hook-key").write_text("signing-key-10\n")
    plan = post(admin, changed).json()
    hook_entry = next(o for o in plan["objects"] if o["name"] == "oncall-hook")
    assert hook_entry["action"] == "update"
    assert hook_entry["secrets_changed"] == ["signing_key"]  # only what was rotated
    assert "signing-key-10" not in str(plan)
    # A file outside the store's directory cannot be named.
    bad = post(admin, {**changed, "fleet/alerting.yaml": ALERTING.replace("hook-key", "../x")})
    entry = next(o for o in bad.json()["objects"] if o["name"] == "oncall-hook")
    assert entry["errors"][0]["path"] == "spec.signing_key"
    assert "is not a secret's name" in entry["errors"][0]["message"]


def test_two_applies_at_once_one_waits_and_none_interleave(api, settings):
    """An apply waits for the one holding the lock (here, another session holding it) and
    goes on when it is released; if it is held past CONTROLPLANE_FLEET_LOCK_SECONDS, the
    apply is refused with 409 and nothing is written."""
    import threading

    import psycopg
    from django.db import connection

    from controlplane.fleet.apply import LOCK

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    holder = psycopg.connect(**params, autocommit=True)
    try:
        holder.execute("SELECT pg_advisory_lock(%s)", [LOCK])
        settings.CONTROLPLANE_FLEET_LOCK_SECONDS = 0.5
        busy = post(api, FILES, dry_run=False)
        assert busy.status_code == 409
        assert busy.json() == {
            "detail": "another apply is in progress; try again once it has finished"
        }
        assert not Pipeline.objects.exists()
        settings.CONTROLPLANE_FLEET_LOCK_SECONDS = 30
        released = threading.Event()

        def release() -> None:
            holder.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
            released.set()

        threading.Timer(1.0, release).start()
        waited = post(api, FILES, dry_run=False)
        assert released.is_set()  # it went on only once the other let go
        assert waited.status_code == 200, waited.json()
        assert Pipeline.objects.count() == 3
    finally:
        holder.close()


def test_drift_reaches_prometheus_and_the_fleet_drift_alert_rule(api, settings):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.alerting import engine
    from controlplane.alerting.models import Alert, AlertRule
    from controlplane.fleet import drift

    assert post(api, FILES, dry_run=False).status_code == 200
    rule = AlertRule.objects.create(name="drift", kind="fleet-drift", params={"minutes": 10})
    scrape = api.get("/metrics").content.decode()
    assert 'cp_fleet_object_drifted{fleet="shop",kind="Pipeline",name="orders-us"} 0.0' in scrape
    api.patch("/api/pipelines/orders-us/", {"description": "by hand"}, format="json")
    then = timezone.now()
    drift.check(then)
    scrape = api.get("/metrics").content.decode()
    assert 'cp_fleet_object_drifted{fleet="shop",kind="Pipeline",name="orders-us"} 1.0' in scrape
    assert 'cp_fleet_object_drifted{fleet="shop",kind="Pipeline",name="orders-eu"} 0.0' in scrape
    engine.evaluate(then + timedelta(minutes=5))
    assert not Alert.objects.filter(rule=rule, state="firing").exists()  # not for 10 min yet
    engine.evaluate(then + timedelta(minutes=11))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == "firing"
    assert alert.message == (
        "1 object differs from its fleet's files: Pipeline/orders-us (fleet shop, for 11 min)"
    )


def test_the_pipeline_page_says_where_it_is_kept_and_how_it_drifted(api, django_user_model):
    from tests.clients import client_with

    applied = post(api, FILES, dry_run=False, repository="git@example:shop", commit="b" * 40)
    assert applied.status_code == 200
    page = client_with(django_user_model, "viewer")
    html = page.get("/pipelines/orders-eu/").content.decode()
    assert (
        "Kept in fleet <strong>shop</strong>'s files: fleet/orders.yaml (template orders)" in html
    )
    assert "git@example:shop at bbbbbbbbbbbb" in html
    assert "Drifted" not in html
    api.patch("/api/pipelines/orders-eu/", {"labels": {"team": "ops"}}, format="json")
    html = page.get("/pipelines/orders-eu/").content.decode()
    assert "<strong>Drifted:</strong>" in html
    assert "<li><code>labels.team: &quot;shop&quot; -&gt; &quot;ops&quot;</code></li>" in html
    assert "Kept in fleet" not in page.get("/pipelines/nothing/").content.decode()


def test_the_plan_carries_the_preflight_and_a_restart_it_fails_waits_unless_forced(
    api, settings, kafka_bootstrap, sink_dsn
):
    from tests.runs import with_current_run

    settings.CONTROLPLANE_PREFLIGHT = "refuse"
    settings.CONTROLPLANE_PREFLIGHT_TIMEOUT = 3.0
    connections = (
        CONNECTIONS.replace("kafka-1:9092", kafka_bootstrap)
        .replace("postgresql://app@db.internal:5432/sales", sink_dsn)
        .replace("  secrets: {password: {env: FLEET_SECRET_WAREHOUSE}}\n", "")
    )
    files = {"fleet/connections.yaml": connections, "fleet/orders.yaml": ORDERS}
    plan = post(api, files)
    assert plan.status_code == 200, plan.json()
    eu = next(o for o in plan.json()["objects"] if o["name"] == "orders-eu")
    # Its connections are new in this plan: nothing reaches them before they are applied.
    assert eu["preflight"] == {"skipped": "it names a connection this apply changes"}
    applied = post(api, files, dry_run=False)
    assert applied.status_code == 200, applied.json()
    eu = next(o for o in applied.json()["objects"] if o["name"] == "orders-eu")
    assert eu["preflight"] == {"skipped": "it names a connection this apply changes"}
    with_current_run(Pipeline.objects.get(name="orders-eu"))
    changed = {**files, "fleet/orders.yaml": ORDERS.replace("default: 5", "default: 8")}
    plan = post(api, changed).json()
    eu = next(o for o in plan["objects"] if o["name"] == "orders-eu")
    assert eu["preflight"]["ok"] is False
    assert "source.topics[0]" in eu["preflight"]["errors"]  # no topic "eu" on the broker
    assert eu["restart"] is False
    assert eu["restart_refused"].startswith("its preflight finds errors: it keeps its run")
    # Applied: the new version is there; the run is not restarted onto it.
    applied = post(api, changed, dry_run=False)
    assert applied.status_code == 200, applied.json()
    eu = Pipeline.objects.get(name="orders-eu")
    assert (eu.version, eu.generation) == (2, 1)
    # The same files again are not "unchanged" while its run runs the older version: with
    # force, it is restarted now.
    again = post(api, changed, dry_run=False, force=True).json()
    entry = next(o for o in again["objects"] if o["name"] == "orders-eu")
    assert (entry["action"], entry["restart"]) == ("unchanged", True)
    assert Pipeline.objects.get(name="orders-eu").generation == 2


def test_adopting_objects_made_elsewhere_is_an_export_and_an_apply(
    api, kafka_connection, postgres_connection, monkeypatch
):
    from tests.factories import valid_spec

    assert api.post("/api/pipelines/", {"name": "orders", "spec": valid_spec()}, format="json")
    api.patch("/api/connections/warehouse/", {"secrets": {"password": "pw-1"}}, format="json")
    exported = api.get("/api/export/").json()
    assert sorted(exported["files"]) == [
        "connections/events.yaml",
        "connections/warehouse.yaml",
        "pipelines/orders.yaml",
    ]
    assert exported["notes"] == [
        "Connection/warehouse: secrets.password is written as {env:"
        " FLEET_SECRET_WAREHOUSE_PASSWORD}: set that variable in the control plane's"
        " environment before applying"
    ]
    refused = post(api, exported["files"], dry_run=False).json()
    assert refused["refused"] and not ManagedObject.objects.exists()
    monkeypatch.setenv("FLEET_SECRET_WAREHOUSE_PASSWORD", "pw-1")
    adopted = post(api, exported["files"], dry_run=False)
    assert adopted.status_code == 200, adopted.json()
    assert {(o["name"], o["action"], o.get("adopted")) for o in adopted.json()["objects"]} == {
        ("events", "unchanged", True),
        ("warehouse", "unchanged", True),
        ("orders", "unchanged", True),
    }
    assert ManagedObject.objects.filter(fleet="shop").count() == 3
    assert Pipeline.objects.get(name="orders").version == 1


def test_a_repository_address_is_kept_without_its_credentials(api):
    repository = "https://gitlab-ci-token:glcbt-s3cret@git.example/shop/fleet.git"
    assert post(api, FILES, dry_run=False, repository=repository).status_code == 200
    version = Pipeline.objects.get(name="orders-eu").versions.get()
    assert version.source["repository"] == "https://git.example/shop/fleet.git"
    assert "glcbt-s3cret" not in str(api.get("/api/fleet/").json())
    assert "glcbt-s3cret" not in str(list(ManagedObject.objects.values_list("source", flat=True)))


def test_an_edit_in_the_pipeline_form_is_drift_the_next_plan_puts_back(api, editor):
    from django.urls import reverse

    from controlplane.pages import forms

    assert post(api, FILES, dry_run=False).status_code == 200
    pipeline = Pipeline.objects.get(name="orders-us")
    values = forms.pipeline_values("orders-us", "by hand", pipeline.spec, "dedicated")
    values = {k: v for k, v in values.items() if v is not None}
    values["version"] = str(pipeline.version)
    response = editor.post(reverse("pipeline-edit", kwargs={"name": "orders-us"}), values)
    assert response.status_code == 302, response.content.decode()[:2000]
    (row,) = api.get("/api/fleet/", {"drifted": "true"}).json()["results"]
    assert row["name"] == "orders-us"
    assert {"path": "description", "after": "by hand"} in row["drifted"]
    plan = post(api, FILES).json()
    us = next(o for o in plan["objects"] if o["name"] == "orders-us")
    assert us["action"] == "update"
    assert {"path": "description", "before": "by hand"} in us["changes"]
