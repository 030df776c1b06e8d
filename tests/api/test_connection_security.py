"""An editor may define connections, but not point them at the control plane's own database,
nor make the control plane hand a stored password to another server. Every change and test
of a connection is audited."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import pytest
from django.db import connection as db_connection
from django.utils import timezone

from controlplane.connections.models import Connection
from controlplane.definitions.models import AuditEntry, Pipeline, Status
from controlplane.supervision import reconciler
from jobs.spec import parse_spec
from tests.factories import files_spec, valid_spec


class PasswordCatcher:
    """A fake Postgres server that asks for a clear-text password and keeps what it gets:
    the proof of where a stored secret was sent."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(8)
        self.port = self.server.getsockname()[1]
        self.passwords: list[str] = []
        self.startups = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with client, contextlib.suppress(OSError):
                client.settimeout(5)
                self._session(client)

    def _read(self, client: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = client.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _session(self, client: socket.socket) -> None:
        while True:
            (length,) = struct.unpack("!I", self._read(client, 4))
            body = self._read(client, length - 4)
            if body[:4] == struct.pack("!I", 80877103):  # SSLRequest: no TLS here
                client.sendall(b"N")
                continue
            break
        self.startups += 1
        client.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        kind = self._read(client, 1)
        if kind == b"p":
            (length,) = struct.unpack("!I", self._read(client, 4))
            self.passwords.append(self._read(client, length - 4).rstrip(b"\0").decode())

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def catchers():
    made: list[PasswordCatcher] = []

    def make() -> PasswordCatcher:
        made.append(PasswordCatcher())
        return made[-1]

    yield make
    for catcher in made:
        catcher.close()


def create(api, name: str, dsn: str, password: str | None = "first-secret"):  # noqa: S107
    body = {"name": name, "kind": "postgres", "settings": {"dsn": dsn}}
    if password:
        body["secrets"] = {"password": password}
    return api.post("/api/connections/", body, format="json")


def test_a_stored_password_never_follows_the_connection_to_another_server(api, catchers):
    first, second = catchers(), catchers()
    assert create(api, "wh", f"postgresql://app@127.0.0.1:{first.port}/sales").status_code == 201
    assert api.post("/api/connections/wh/test/").json()["ok"] is False
    assert first.passwords == ["first-secret"]  # the catcher works: the password went there

    moved = api.patch(
        "/api/connections/wh/",
        {"settings": {"dsn": f"postgresql://app@127.0.0.1:{second.port}/sales"}},
        format="json",
    )
    assert moved.status_code == 200, moved.json()
    assert moved.json()["secret_fields"] == []
    result = api.post("/api/connections/wh/test/").json()
    assert result["ok"] is False
    assert second.startups == 1 and second.passwords == []  # asked, and nothing was sent
    assert "first-secret" not in str(result)

    entries = AuditEntry.objects.filter(connection_name="wh").order_by("id")
    assert [e.action for e in entries] == [
        "connection-create",
        "connection-test",
        "connection-update",
        "connection-test",
    ]
    update = entries[2]
    assert update.actor_name == "oncall"
    assert update.after["secrets_dropped"] == ["password"]
    assert update.before["secret_fields"] == ["password"] and update.after["secret_fields"] == []
    assert "first-secret" not in str(list(entries.values()))


@pytest.mark.parametrize(
    "change",
    [
        {"dsn": "postgresql://app@db.other:5432/sales"},  # host
        {"dsn": "postgresql://app@db.internal:5433/sales"},  # port
        {"dsn": "postgresql://app@db.internal:5432/other"},  # database
        {"dsn": "postgresql://root@db.internal:5432/sales"},  # user
        {"dsn": "postgresql://app@db.internal:5432/sales?sslmode=disable"},  # TLS
    ],
)
def test_every_endpoint_change_drops_the_stored_password(api, change):
    assert create(api, "wh", "postgresql://app@db.internal:5432/sales").status_code == 201
    response = api.patch("/api/connections/wh/", {"settings": change}, format="json")
    assert response.status_code == 200, response.json()
    assert Connection.objects.get(name="wh").get_secrets() == {}


def test_a_new_password_given_with_the_move_is_kept_and_other_changes_keep_the_old(api):
    assert create(api, "wh", "postgresql://app@db.internal:5432/sales").status_code == 201
    api.patch(
        "/api/connections/wh/",
        {
            "description": "nightly",
            "settings": {"dsn": "postgresql://app@db.internal:5432/sales?application_name=x"},
        },
        format="json",
    )
    assert Connection.objects.get(name="wh").get_secrets() == {"password": "first-secret"}
    api.patch(
        "/api/connections/wh/",
        {
            "settings": {"dsn": "postgresql://app@db.new:5432/sales"},
            "secrets": {"password": "second-secret"},
        },
        format="json",
    )
    assert Connection.objects.get(name="wh").get_secrets() == {"password": "second-secret"}


def test_moving_a_kafka_connection_drops_its_sasl_password(api):
    settings = {
        "bootstrap_servers": ["k1:9093"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "svc",
    }
    response = api.post(
        "/api/connections/",
        {"name": "k", "kind": "kafka", "settings": settings, "secrets": {"sasl_password": "pw"}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    for change, kept in (
        ({"client_id": "nightly"}, True),
        ({"bootstrap_servers": ["evil:9093"]}, False),
    ):
        response = api.patch(
            "/api/connections/k/", {"settings": {**settings, **change}}, format="json"
        )
        assert response.status_code == 200, response.json()
        assert bool(Connection.objects.get(name="k").get_secrets()) is kept


def _own_database() -> tuple[str, str, str]:
    own = db_connection.settings_dict
    return own["HOST"], own["PORT"], own["NAME"]


def test_the_control_plane_database_is_refused_however_it_is_named(api, settings):
    host, port, name = _own_database()
    assert host in ("127.0.0.1", "localhost")  # the embedded stack's; the names below assume it
    configured = settings.DATABASES["default"]["NAME"]
    hostname = socket.gethostname()
    settings.CONTROLPLANE_ALLOW_UNIX_SOCKETS = True
    for i, dsn in enumerate(
        [
            f"postgresql://controlplane@127.0.0.1:{port}/{name}",
            f"postgresql://controlplane@localhost:{port}/{name}",
            f"postgresql://controlplane@{hostname}:{port}/{name}",
            f"postgresql://controlplane@[::1]:{port}/{name}",
            f"postgresql://controlplane@127.0.0.2:{port}/{configured}",
            f"postgresql://controlplane@%2Fvar%2Frun%2Fpostgresql:{port}/{name}",
        ]
    ):
        response = create(api, f"own-{i}", dsn)
        assert response.status_code == 400, (dsn, response.json())
        assert "control plane's own database" in response.json()["settings.dsn"][0], dsn
    assert not Connection.objects.exists()
    assert not AuditEntry.objects.exists()
    # The same server, another database: a sink like any other.
    assert (
        create(api, "beside", f"postgresql://controlplane@127.0.0.1:{port}/sinkdb").status_code
        == 201
    )


def test_a_connection_moved_onto_the_control_plane_database_later_is_refused_at_launch(
    api, pipeline
):
    host, port, name = _own_database()
    # Stored behind the API's back (an older version, or a database moved since).
    Connection.objects.filter(name="warehouse").update(
        settings={"dsn": f"postgresql://controlplane@{host}:{port}/{name}"}
    )
    stored = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=stored.pk).update(desired_state="running", status=Status.STOPPED)
    reconciler.reconcile_pipeline(stored.pk, timezone.now())
    stored.refresh_from_db()
    assert stored.status == Status.FAILED  # permanent: not restarted
    failure = stored.failures.get()
    assert failure.permanent
    assert "control plane's own database" in failure.message
    assert not stored.runs.exclude(pid=None).exists()  # no driver was started
    # And a test of it is refused without connecting.
    result = api.post("/api/connections/warehouse/test/").json()
    assert result["ok"] is False and "control plane's own database" in result["detail"]


@pytest.mark.parametrize(
    "table",
    ["_cp_commits", "public._cp_dead_letters", "pg_catalog.pg_authid", "information_schema.tables"],
)
def test_a_sink_may_not_write_to_the_sinks_own_or_the_systems_tables(
    api, kafka_connection, postgres_connection, table
):
    spec = valid_spec()
    spec["sink"]["table"] = table
    response = api.post("/api/pipelines/", {"name": "forge", "spec": spec}, format="json")
    assert response.status_code == 400
    assert "spec.sink.table" in response.json()
    assert not Pipeline.objects.exists()


def test_connection_create_update_and_delete_are_audited(api):
    assert create(api, "wh", "postgresql://app@db.internal:5432/sales").status_code == 201
    api.patch("/api/connections/wh/", {"description": "nightly"}, format="json")
    assert api.delete("/api/connections/wh/").status_code == 204
    listed = api.get("/api/audit/?connection=wh").json()["results"]
    assert [e["action"] for e in listed] == [
        "connection-delete",
        "connection-update",
        "connection-create",
    ]
    assert all(e["connection"] == "wh" and e["actor"] == "oncall" for e in listed)
    assert listed[2]["after"]["secret_fields"] == ["password"]
    assert "first-secret" not in str(listed)


def test_pipeline_creation_is_audited(api, pipeline):
    listed = api.get("/api/audit/?pipeline=orders").json()["results"]
    assert [(e["action"], e["actor"]) for e in listed] == [("create", "oncall")]


def test_a_files_sink_gets_its_root_at_launch_checked_again_against_the_policy(
    api, kafka_connection, files_connection, files_dir, settings
):
    from controlplane.supervision import launcher

    created = api.post("/api/pipelines/", {"name": "files", "spec": files_spec()}, format="json")
    assert created.status_code == 201, created.json()
    stored = Pipeline.objects.get(name="files")
    sink = parse_spec(stored.spec).sink
    assert launcher.sink_config(stored, sink) == {"files": {"root": f"file://{files_dir}/lake"}}
    # The policy changed since the connection was saved (the production profile, say).
    settings.CONTROLPLANE_FILES_DIR = None
    with pytest.raises(launcher.SinkRefused, match=r"connection 'lake': settings\.root local"):
        launcher.sink_config(stored, sink)
    Pipeline.objects.filter(pk=stored.pk).update(desired_state="running", status=Status.STOPPED)
    reconciler.reconcile_pipeline(stored.pk, timezone.now())
    stored.refresh_from_db()
    assert stored.status == Status.FAILED  # permanent: not restarted
    failure = stored.failures.get()
    assert failure.permanent and "CONTROLPLANE_FILES_DIR" in failure.message
    assert not stored.runs.exclude(pid=None).exists()  # no driver was started
