"""Cassandra connections and the cassandra sink before anything runs, against the real node
`./stack test` starts: a connection's settings checked (Cassandra's own keyspaces, TLS files
only from the certificate directory), its password write-only and dropped when the cluster or
user changes, a real test (log in, the keyspace); the preflight of a cassandra sink (a table
that does not exist, a column of another type, a counter table, a dead-letter topic that does
not exist), each at its field."""

from __future__ import annotations

import uuid

import pytest

from tests.factories import valid_spec
from tests.kafka_helpers import new_topic
from tests.stores import cassandra_env, cassandra_session

pytestmark = [pytest.mark.kafka, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _refuse(settings):
    settings.CONTROLPLANE_PREFLIGHT = "refuse"
    settings.CONTROLPLANE_PREFLIGHT_TIMEOUT = 5


def settings_of(keyspace: str = "cp_test", **more) -> dict:
    env = cassandra_env()
    return {
        "contact_points": env.hosts.split(","),
        "local_datacenter": env.dc,
        "keyspace": keyspace,
        "username": env.user,
        **more,
    }


def create(api, name: str, settings: dict, password: str | None):
    body = {"name": name, "kind": "cassandra", "settings": settings}
    if password is not None:
        body["secrets"] = {"password": password}
    return api.post("/api/connections/", body, format="json")


def test_a_connection_is_checked_tested_and_its_password_follows_the_cluster(
    api, cassandra_connection, settings, tmp_path
):
    tested = api.post("/api/connections/cluster/test/").json()
    assert tested["ok"], tested
    assert tested["server_version"].startswith("5.0")
    assert "keyspace 'cp_test'" in tested["detail"]
    shown = api.get("/api/connections/cluster/").json()
    assert "password" not in str(shown["settings"]) and shown["secret_fields"] == ["password"]
    # A wrong password: refused by the cluster, said without the password.
    response = create(api, "wrong", settings_of(), "not-the-password-81x")
    assert response.status_code == 201, response.json()
    tested = api.post("/api/connections/wrong/test/").json()
    assert not tested["ok"] and "not-the-password-81x" not in tested["detail"]
    assert "Authentication" in tested["detail"] or "credentials" in tested["detail"].lower()
    # A keyspace that does not exist (the control plane never creates one).
    create(api, "elsewhere", settings_of("no_such_keyspace"), cassandra_env().password)
    tested = api.post("/api/connections/elsewhere/test/").json()
    assert not tested["ok"] and "keyspace 'no_such_keyspace' does not exist" in tested["detail"]
    # Moving the connection to another cluster drops the stored password.
    changed = api.patch(
        "/api/connections/cluster/",
        {"settings": settings_of(contact_points=["10.9.8.7:9042"])},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    assert api.get("/api/connections/cluster/").json()["secret_fields"] == []


def test_cassandras_own_keyspaces_and_files_outside_the_cert_dir_are_refused(
    api, settings, tmp_path
):
    response = create(api, "sys", settings_of("system_auth"), "x")
    assert response.status_code == 400
    assert "one of Cassandra's own keyspaces" in response.json()["settings.keyspace"][0]
    settings.CONTROLPLANE_CERT_DIR = str(tmp_path)
    response = create(api, "tls", settings_of(tls=True, ssl_cafile="/etc/passwd"), "x")
    assert response.status_code == 400
    assert "not a file in the certificate directory" in response.json()["settings.ssl_cafile"][0]
    response = create(api, "tls2", settings_of(tls=True), "x")
    assert "is required with tls: true" in response.json()["settings.ssl_cafile"][0]


def table_name() -> str:
    return f"pf_{uuid.uuid4().hex[:10]}"


def draft(api, body: dict) -> dict:
    response = api.post("/api/pipelines/preflight/", {"spec": body}, format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def cassandra_spec(topic: str, table: str, **sink) -> dict:
    return valid_spec(
        source={
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT, at TIMESTAMP",
            "starting_offsets": "earliest",
        },
        transform=None,
        sink={
            "kind": "cassandra",
            "connection": "cluster",
            "table": table,
            "dead_letters": {"connection": "warehouse"},
            **sink,
        },
    )


def test_the_preflight_of_a_cassandra_sink(
    api, kafka_connection, postgres_connection, cassandra_connection, kafka_bootstrap
):
    topic = new_topic(kafka_bootstrap)
    table = table_name()
    # Missing, without a primary key to create it with: an error; with one: it will be made.
    report = draft(api, cassandra_spec(topic, table))
    assert "does not exist in keyspace 'cp_test'" in report["errors"]["sink.table"][0]
    report = draft(api, cassandra_spec(topic, table, partition_key=["id"]))
    assert report["ok"], report
    with cassandra_session("cp_test") as session:
        session.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, n timestamp, at timestamp)")
        try:
            [message] = draft(api, cassandra_spec(topic, table))["errors"]["sink.table"]
            assert "column 'n' of table" in message and "cannot take the output's int" in message
            session.execute(f"ALTER TABLE {table} DROP n")
            session.execute(f"ALTER TABLE {table} ADD n bigint")  # int widens into bigint
            assert draft(api, cassandra_spec(topic, table))["ok"]
            counters = table_name()
            session.execute(f"CREATE TABLE {counters} (id text PRIMARY KEY, n counter)")
            found = draft(api, cassandra_spec(topic, counters))["errors"]["sink.table"]
            assert any("is a counter table" in m for m in found), found
        finally:
            session.execute(f"DROP TABLE IF EXISTS {table}")
            session.execute(f"DROP TABLE IF EXISTS {counters}")
    # Its dead letters' topic must exist.
    body = cassandra_spec(topic, table_name(), partition_key=["id"])
    body["sink"]["dead_letters"] = {"connection": "events", "topic": "no-such-topic-c1"}
    report = draft(api, body)
    assert "does not exist" in report["errors"]["sink.dead_letters.topic"][0]
