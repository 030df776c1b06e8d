"""What an editor may not do, through the API and through the pages' forms alike: each
request is refused naming the problem, and nothing is written."""

from __future__ import annotations

import html

import pytest
from django.db import connection as db_connection
from django.urls import reverse

from controlplane.connections.models import Connection
from controlplane.definitions.models import AuditEntry, Pipeline
from tests.clients import field_errors, new_pipeline_post

ATTACKS = [
    ("SELECT TRANSFORM(id) USING 'sh -c id' AS (x STRING) FROM source", "script transform"),
    ("SELECT reflect('java.lang.System', 'getenv', 'HOME') FROM source", "'reflect'"),
    ("SELECT java_method('java.lang.Runtime', 'getRuntime') FROM source", "'java_method'"),
]


@pytest.mark.parametrize(("sql", "named"), ATTACKS)
def test_the_pipeline_form_refuses_transforms_that_reach_the_host(
    editor,
    kafka_connection,
    postgres_connection,
    sql,
    named,
):
    response = editor.post(reverse("pipeline-new"), new_pipeline_post(transform_sql=sql))
    assert response.status_code == 400
    problem = html.unescape(field_errors(response.content.decode(), "transform_sql"))
    assert named in problem.lower() or named in problem, problem
    assert not Pipeline.objects.filter(name="payments").exists()


def own_dsn() -> str:
    own = db_connection.settings_dict
    return f"postgresql://{own['USER']}@{own['HOST']}:{own['PORT']}/{own['NAME']}"


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        (None, "control plane's own database"),
        ("postgresql://app@db:5432/dw?passfile=/root/.pgpass", "'passfile'"),
        ("postgresql://app@db:5432/dw?sslkey=/etc/ssl/private/k.pem", "'sslkey'"),
        ("postgresql://app@%2Fvar%2Frun%2Fpostgresql/dw", "Unix socket"),
        ("postgresql://app@db:5432/dw?host=/tmp", "'host'"),
    ],
)
def test_connections_that_reach_the_host_or_the_control_plane_are_refused(
    api,
    editor,
    dsn,
    named,
):
    dsn = dsn or own_dsn()
    response = api.post(
        "/api/connections/",
        {"name": "dw", "kind": "postgres", "settings": {"dsn": dsn}},
        format="json",
    )
    assert response.status_code == 400
    assert named in response.json()["settings.dsn"][0]
    page = editor.post(
        reverse("connection-new"), {"kind": "postgres", "name": "dw", "dsn": dsn, "password": "pw"}
    )
    assert page.status_code == 400
    assert named in html.unescape(page.content.decode())
    assert not Connection.objects.exists()
    assert not AuditEntry.objects.exists()


def test_a_kafka_connection_may_not_name_files_of_the_host(api):
    response = api.post(
        "/api/connections/",
        {
            "name": "k",
            "kind": "kafka",
            "settings": {
                "bootstrap_servers": ["k:9093"],
                "security_protocol": "SSL",
                "ssl_keyfile": "/etc/ssl/private/server.key",
            },
        },
        format="json",
    )
    assert response.status_code == 400
    assert "CONTROLPLANE_CERT_DIR" in response.json()["settings.ssl_keyfile"][0]
    assert not Connection.objects.exists()


@pytest.mark.parametrize("table", ["_cp_commits", "pg_catalog.pg_authid"])
def test_the_pipeline_form_refuses_the_sinks_own_and_the_systems_tables(
    editor,
    kafka_connection,
    postgres_connection,
    table,
):
    response = editor.post(reverse("pipeline-new"), new_pipeline_post(table=table))
    assert response.status_code == 400
    problem = html.unescape(field_errors(response.content.decode(), "table"))
    assert table in problem, problem
    assert not Pipeline.objects.filter(name="payments").exists()
