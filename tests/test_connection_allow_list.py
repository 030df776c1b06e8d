"""What a connection may say: the Postgres DSN allow-list, TLS files from one directory, Unix
sockets only when an admin allows them. Pure logic (jobs.connections)."""

from __future__ import annotations

import pytest

from jobs.connections import (
    CONNECT_DEFAULTS,
    ConnectionPolicy,
    parse_postgres_dsn,
    postgres_conninfo,
    validate_connection,
)
from jobs.sinks.postgres.jvm import jdbc_target
from jobs.spec import SpecError


def dsn_error(dsn: str, policy: ConnectionPolicy | None = None) -> str:
    with pytest.raises(SpecError) as caught:
        validate_connection("postgres", {"dsn": dsn}, {}, policy)
    problems = caught.value.as_dict()
    assert list(problems) == ["settings.dsn"]
    return problems["settings.dsn"][0]


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("passfile=/root/.pgpass", "passfile"),
        ("sslkey=/etc/ssl/private/key.pem", "sslkey"),
        ("sslcert=/etc/ssl/cert.pem", "sslcert"),
        ("sslkeylogfile=/tmp/keys", "sslkeylogfile"),
        ("service=prod", "service"),
        ("hostaddr=10.0.0.1", "hostaddr"),
        ("target_session_attrs=any", "target_session_attrs"),
        ("krbsrvname=postgres", "krbsrvname"),
    ],
)
def test_libpq_parameters_outside_the_allow_list_are_refused_by_name(query, named):
    message = dsn_error(f"postgresql://app@db.internal:5432/sales?{query}")
    assert f"parameter {named!r} is not allowed" in message


@pytest.mark.parametrize("name", ["host", "port", "dbname", "user"])
def test_the_endpoint_cannot_be_overridden_from_the_query_string(name):
    message = dsn_error(f"postgresql://app@db.internal/sales?{name}=/var/run/postgresql")
    assert f"parameter {name!r} is not allowed in the query string" in message


def test_unix_sockets_are_refused_unless_an_admin_allows_them():
    for dsn in (
        "postgresql://app@%2Fvar%2Frun%2Fpostgresql/sales",
        "postgresql://app@%2Ftmp:5432/sales",
    ):
        assert "is a Unix socket" in dsn_error(dsn)
        clean, _ = validate_connection(
            "postgres", {"dsn": dsn}, {}, ConnectionPolicy(allow_unix_sockets=True)
        )
        assert clean == {"dsn": dsn}


def test_several_hosts_are_refused():
    assert "several hosts" in dsn_error("postgresql://app@a:5432,b:5432/sales")


def test_allowed_parameters_are_checked_and_passed_on():
    params = parse_postgres_dsn(
        "postgresql://app@db.internal:6543/sales?sslmode=verify-full&connect_timeout=5"
        "&application_name=nightly&options=-c%20search_path%3Dsales,public"
    )
    assert params == {
        "host": "db.internal",
        "port": "6543",
        "dbname": "sales",
        "user": "app",
        "sslmode": "verify-full",
        "connect_timeout": "5",
        "application_name": "nightly",
        "options": "-c search_path=sales,public",
    }
    assert "sslmode 'maybe'" in dsn_error("postgresql://a@h/d?sslmode=maybe")
    assert "connect_timeout" in dsn_error("postgresql://a@h/d?connect_timeout=0")
    assert "search_path" in dsn_error("postgresql://a@h/d?options=-c%20log_statement%3Dall")
    assert "search_path" in dsn_error(
        "postgresql://a@h/d?options=-c%20search_path%3Dx%20-c%20log_statement%3Dall"
    )
    assert "twice" in dsn_error("postgresql://a@h/d?sslmode=require&sslmode=disable")


def test_tls_files_must_be_in_the_certificate_directory(tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "outside.pem").write_text("x")
    policy = ConnectionPolicy(cert_dir=str(certs))
    assert "CONTROLPLANE_CERT_DIR" in dsn_error("postgresql://a@h/d?sslrootcert=ca.pem")
    params = parse_postgres_dsn("postgresql://a@h/d?sslrootcert=ca.pem", policy)
    assert params["sslrootcert"] == str(certs / "ca.pem")
    for escape in ("../outside.pem", str(tmp_path / "outside.pem"), "/etc/passwd", "missing.pem"):
        assert "certificate directory" in dsn_error(
            f"postgresql://a@h/d?sslrootcert={escape}", policy
        )
    with pytest.raises(SpecError) as caught:
        validate_connection(
            "kafka",
            {
                "bootstrap_servers": ["k:9093"],
                "security_protocol": "SSL",
                "ssl_cafile": "/etc/shadow",
            },
            {},
            policy,
        )
    assert list(caught.value.as_dict()) == ["settings.ssl_cafile"]
    clean, _ = validate_connection(
        "kafka",
        {"bootstrap_servers": ["k:9093"], "security_protocol": "SSL", "ssl_cafile": "ca.pem"},
        {},
        policy,
    )
    assert clean["ssl_cafile"] == str(certs / "ca.pem")


def test_local_files_roots_must_be_inside_the_files_directory(tmp_path):
    files = tmp_path / "files"
    (files / "lake").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (files / "escape").symlink_to(tmp_path / "elsewhere")

    def root_error(root: str, policy: ConnectionPolicy | None) -> str:
        with pytest.raises(SpecError) as caught:
            validate_connection("files", {"root": root}, {}, policy)
        problems = caught.value.as_dict()
        assert list(problems) == ["settings.root"]
        return problems["settings.root"][0]

    # No directory allowed (the default policy, the production profile): no local root,
    # and the message says which setting allows them.
    message = root_error(f"file://{files}/lake", None)
    assert "not allowed until an admin sets CONTROLPLANE_FILES_DIR" in message
    policy = ConnectionPolicy(files_dir=str(files))
    for root in (f"file://{files}", f"file://{files}/lake", f"file://{files}/not-yet-made"):
        clean, _ = validate_connection("files", {"root": root}, {}, policy)
        assert clean == {"root": root}
    for escape in (
        f"file://{tmp_path}/elsewhere",
        f"file://{files}/escape",  # a symbolic link out of it
        f"file://{files}/escape/deeper",
        "file:///etc",
        "file:///",
    ):
        assert "is not inside" in root_error(escape, policy), escape
    assert "CONTROLPLANE_FILES_DIR" in root_error("file:///etc", policy)
    # Other file systems are not local: the files directory says nothing about them.
    for root in ("hdfs://nn:8020/lake", "s3a://bucket/lake"):
        assert validate_connection("files", {"root": root}, {}, None)[0] == {"root": root}


def test_connect_arguments_spell_everything_out_and_read_no_local_files():
    kwargs = postgres_conninfo({"dsn": "postgresql://app@db:5433/sales"}, {"password": "pw"})
    assert "conninfo" not in kwargs  # nothing libpq would parse on its own
    assert kwargs["passfile"] == "/dev/null"  # never the host's ~/.pgpass
    assert kwargs["sslcertmode"] == "disable"  # never the host's ~/.postgresql/*.crt
    assert kwargs["password"] == "pw"
    assert {k: kwargs[k] for k in CONNECT_DEFAULTS} == CONNECT_DEFAULTS
    assert kwargs["options"] == "-c statement_timeout=600000"  # a lock never holds it forever
    with_path = postgres_conninfo(
        {"dsn": "postgresql://app@db/sales?options=-c%20search_path%3Dsales"}, {}
    )
    assert with_path["options"] == "-c statement_timeout=600000 -c search_path=sales"
    # A stored DSN is checked again: a policy that no longer allows it refuses it.
    with pytest.raises(ValueError, match="Unix socket"):
        postgres_conninfo({"dsn": "postgresql://app@%2Ftmp/sales"}, {})


def test_the_jdbc_url_encodes_the_database_name():
    url, props = jdbc_target(
        postgres_conninfo({"dsn": "postgresql://app@db:5433/x%3FsocketFactory%3Devil"}, {})
    )
    assert url == "jdbc:postgresql://db:5433/x%3FsocketFactory%3Devil"
    assert "socketFactory" not in props
    assert props["tcpKeepAlive"] == "true"
    assert props["connectTimeout"] == "10"
