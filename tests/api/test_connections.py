"""Connections through the API: CRUD, secrets that never come back, real connectivity checks."""

from __future__ import annotations

import logging
import os

import pytest
from django.db import connection as django_db

from controlplane.connections.models import Connection
from tests.factories import valid_spec

SECRET = "s3cr3t-Pa55word"


def create(api, **body):
    return api.post("/api/connections/", body, format="json")


def test_it_creates_lists_and_shows_a_kafka_connection(api):
    response = create(
        api, name="events", kind="kafka", settings={"bootstrap_servers": ["kafka-1:9092"]}
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["settings"] == {
        "bootstrap_servers": ["kafka-1:9092"],
        "security_protocol": "PLAINTEXT",
    }
    assert body["secret_fields"] == []
    listing = api.get("/api/connections/").json()
    assert listing["count"] == 1
    assert listing["results"][0]["name"] == "events"
    assert api.get("/api/connections/events/").json()["kind"] == "kafka"


def test_secrets_are_never_returned_only_named(api):
    response = create(
        api,
        name="secure",
        kind="kafka",
        settings={
            "bootstrap_servers": ["k:9093"],
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "PLAIN",
            "sasl_username": "svc",
        },
        secrets={"sasl_password": SECRET},
    )
    assert response.status_code == 201, response.json()
    for reply in (response, api.get("/api/connections/"), api.get("/api/connections/secure/")):
        assert SECRET not in reply.content.decode()
    assert response.json()["secret_fields"] == ["sasl_password"]


def test_a_dsn_password_is_stored_encrypted_and_shown_nowhere(api, caplog):
    with caplog.at_level(logging.DEBUG):
        response = create(
            api,
            name="pg",
            kind="postgres",
            settings={"dsn": f"postgresql://app:{SECRET}@db.internal:5432/sales"},
        )
    assert response.status_code == 201, response.json()
    assert response.json()["settings"]["dsn"] == "postgresql://app@db.internal:5432/sales"
    assert response.json()["secret_fields"] == ["password"]
    assert SECRET not in response.content.decode()
    assert SECRET not in caplog.text
    with django_db.cursor() as cursor:
        cursor.execute("SELECT settings::text, secrets_encrypted FROM connections_connection")
        stored = " ".join(cursor.fetchone())
    assert SECRET not in stored
    assert Connection.objects.get(name="pg").get_secrets() == {"password": SECRET}
    assert SECRET not in repr(Connection.objects.get(name="pg"))


def test_patching_secrets_merges_and_null_removes(api):
    create(
        api,
        name="k",
        kind="kafka",
        settings={"bootstrap_servers": ["k:1"], "security_protocol": "SSL"},
        secrets={"ssl_password": "one"},
    )
    api.patch("/api/connections/k/", {"description": "prod"}, format="json")
    assert Connection.objects.get(name="k").get_secrets() == {"ssl_password": "one"}
    api.patch("/api/connections/k/", {"secrets": {"ssl_password": None}}, format="json")
    assert Connection.objects.get(name="k").get_secrets() == {}


def test_bad_settings_are_refused_with_field_errors(api):
    response = create(api, name="Bad Name", kind="kafka", settings={"bootstrap_servers": ["nope"]})
    assert response.status_code == 400
    body = response.json()
    assert "name" in body
    assert body["settings.bootstrap_servers[0]"] == ["'nope' is not host:port"]


def test_name_and_kind_cannot_change(api, kafka_connection):
    response = api.put(
        "/api/connections/events/",
        {"name": "renamed", "kind": "postgres", "settings": {"dsn": "postgresql://a@b/c"}},
        format="json",
    )
    assert response.status_code == 400
    assert set(response.json()) >= {"name", "kind"}


def test_a_connection_in_use_cannot_be_deleted(api, pipeline):
    response = api.delete("/api/connections/events/")
    assert response.status_code == 409
    assert "orders" in response.json()["detail"]
    assert Connection.objects.filter(name="events").exists()


def test_an_unused_connection_can_be_deleted(api, kafka_connection):
    assert api.delete("/api/connections/events/").status_code == 204
    assert not Connection.objects.filter(name="events").exists()


def test_deleting_a_pipeline_frees_its_connections(api, pipeline):
    assert api.delete("/api/pipelines/orders/").status_code == 204
    assert api.delete("/api/connections/events/").status_code == 204


def test_the_kafka_check_really_reaches_the_broker(api, kafka_bootstrap):
    from tests.kafka_helpers import new_topic, produce

    # The broker creates no topic on first use (auto.create.topics.enable=false): made here.
    topic = new_topic(kafka_bootstrap, partitions=1, prefix="connection-check")
    produce(kafka_bootstrap, topic, [b"{}"], partitions=1)
    create(api, name="events", kind="kafka", settings={"bootstrap_servers": [kafka_bootstrap]})
    response = api.post("/api/connections/events/test/")
    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is True, body
    assert topic in body["topics"]


def test_the_kafka_check_reports_an_unreachable_cluster(api, settings):
    settings.CONTROLPLANE_CONNECTION_TEST_TIMEOUT = 1.0
    create(api, name="gone", kind="kafka", settings={"bootstrap_servers": ["127.0.0.1:1"]})
    body = api.post("/api/connections/gone/test/").json()
    assert body["ok"] is False
    assert body["detail"]


def test_the_postgres_check_runs_select_1(api, postgres_connection):
    body = api.post("/api/connections/warehouse/test/").json()
    assert body["ok"] is True, body
    assert body["server_version"]


def test_a_failed_postgres_check_does_not_leak_the_password(api, sink_dsn):
    # Right server, wrong database: the error text mentions the connection, never the password.
    dsn = sink_dsn.rsplit("/", 1)[0] + "/no_such_database"
    create(api, name="pg", kind="postgres", settings={"dsn": dsn}, secrets={"password": SECRET})
    body = api.post("/api/connections/pg/test/").json()
    assert body["ok"] is False
    assert "no_such_database" in body["detail"]
    assert SECRET not in body["detail"]


@pytest.mark.parametrize("kind", ["kafka", "postgres"])
def test_the_admin_list_shows_no_secrets(admin_client, api, kind):
    if kind == "kafka":
        create(
            api,
            name="k",
            kind="kafka",
            settings={"bootstrap_servers": ["k:1"], "security_protocol": "SSL"},
            secrets={"ssl_password": SECRET},
        )
    else:
        create(api, name="k", kind="postgres", settings={"dsn": f"postgresql://u:{SECRET}@h/d"})
    listing = admin_client.get("/admin/connections/connection/")
    assert listing.status_code == 200
    assert SECRET not in listing.content.decode()
    pk = Connection.objects.get(name="k").pk
    change = admin_client.get(f"/admin/connections/connection/{pk}/change/")
    assert change.status_code == 200
    assert SECRET not in change.content.decode()


def test_pipelines_refer_to_connections_by_name(api, kafka_connection, postgres_connection):
    response = api.post("/api/pipelines/", {"name": "p", "spec": valid_spec()}, format="json")
    assert response.status_code == 201
    assert response.json()["spec"]["source"]["connection"] == "events"


# -- files connections ------------------------------------------------------------------------


def test_a_files_connection_keeps_its_normalised_root_and_has_no_secrets(api, files_dir):
    response = create(api, name="lake", kind="files", settings={"root": f"file:{files_dir}/a/"})
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["kind"], body["settings"], body["secret_fields"]) == (
        "files",
        {"root": f"file://{files_dir}/a"},
        [],
    )
    response = create(api, name="hdfs", kind="files", settings={"root": "hdfs://nn:8020/lake"})
    assert response.status_code == 201, response.json()
    assert api.get("/api/connections/hdfs/").json()["settings"] == {"root": "hdfs://nn:8020/lake"}


def test_bad_files_roots_are_refused_on_settings_root(api, files_dir, settings):
    for root, message in (
        ("/srv/lake", "must be a URI"),
        ("ftp://h/x", "scheme 'ftp' is not one of"),
        (f"file://{files_dir}/../x", "is not normalised"),
        ("file:///etc", "is not inside"),
    ):
        response = create(api, name="lake", kind="files", settings={"root": root})
        assert response.status_code == 400, root
        assert message in response.json()["settings.root"][0], response.json()
    response = create(api, name="lake", kind="files", settings={"root": "x"}, secrets={"a": "b"})
    assert set(response.json()) == {"settings.root", "secrets.a"}
    settings.CONTROLPLANE_FILES_DIR = None  # the production profile's default
    response = create(api, name="lake", kind="files", settings={"root": f"file://{files_dir}"})
    assert "CONTROLPLANE_FILES_DIR" in response.json()["settings.root"][0]
    assert not Connection.objects.exists()


def test_a_local_root_may_not_hold_or_be_inside_the_control_plane_s_own_directories(
    api, settings, tmp_path
):
    settings.CONTROLPLANE_FILES_DIR = str(tmp_path)
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "cp" / "checkpoints"
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "cp" / "runs"
    for root in (f"file://{tmp_path}/cp", f"file://{tmp_path}/cp/runs/orders"):
        response = create(api, name="lake", kind="files", settings={"root": root})
        assert response.status_code == 400
        assert "the control plane's own directory" in response.json()["settings.root"][0]
    response = create(api, name="lake", kind="files", settings={"root": f"file://{tmp_path}/lake"})
    assert response.status_code == 201, response.json()


def test_the_files_check_looks_at_a_local_root_and_says_it_does_not_probe_others(
    api, files_dir, settings
):
    create(api, name="lake", kind="files", settings={"root": f"file://{files_dir}/lake"})
    body = api.post("/api/connections/lake/test/").json()
    assert (body["ok"], body["detail"]) == (False, f"{files_dir}/lake does not exist")
    (files_dir / "lake").write_text("not a directory")
    body = api.post("/api/connections/lake/test/").json()
    assert (body["ok"], body["detail"]) == (False, f"{files_dir}/lake is not a directory")
    (files_dir / "lake").unlink()
    (files_dir / "lake").mkdir(mode=0o500)
    try:
        body = api.post("/api/connections/lake/test/").json()
        if os.geteuid() != 0:  # root may write anywhere
            assert body["ok"] is False
            assert body["detail"] == f"{files_dir}/lake is not writable by the control plane's user"
        (files_dir / "lake").chmod(0o700)
        body = api.post("/api/connections/lake/test/").json()
        assert (body["ok"], body["detail"]) == (True, f"{files_dir}/lake is a writable directory")
    finally:
        (files_dir / "lake").chmod(0o700)
    # Allowed when saved, not any more: refused without looking.
    settings.CONTROLPLANE_FILES_DIR = None
    body = api.post("/api/connections/lake/test/").json()
    assert body["ok"] is False and "CONTROLPLANE_FILES_DIR" in body["detail"]
    create(api, name="hdfs", kind="files", settings={"root": "hdfs://nn:8020/lake"})
    body = api.post("/api/connections/hdfs/test/").json()
    assert body["ok"] is True
    assert body["detail"].startswith("not probed from the control plane: hdfs:// roots")


def test_the_admin_lists_a_files_connection_with_its_root(admin_client, api):
    create(api, name="hdfs", kind="files", settings={"root": "hdfs://nn:8020/lake"})
    listing = admin_client.get("/admin/connections/connection/").content.decode()
    assert "hdfs://nn:8020/lake" in listing
