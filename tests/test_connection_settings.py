"""Connection settings validation and client arguments: pure logic."""

from __future__ import annotations

import pytest

from jobs.connections import (
    CONNECT_DEFAULTS,
    ConnectionPolicy,
    files_root,
    kafka_client_config,
    postgres_conninfo,
    strip_password,
    validate_connection,
)
from jobs.spec import SpecError


def errors(kind, settings, secrets=None):
    with pytest.raises(SpecError) as caught:
        validate_connection(kind, settings, secrets or {})
    return caught.value.as_dict()


def test_kafka_bootstrap_servers_accept_a_list_or_a_comma_separated_string():
    settings, _ = validate_connection("kafka", {"bootstrap_servers": "a:9092, b:9093"}, {})
    assert settings["bootstrap_servers"] == ["a:9092", "b:9093"]
    assert settings["security_protocol"] == "PLAINTEXT"


def test_kafka_rejects_servers_without_a_port():
    assert errors("kafka", {"bootstrap_servers": ["broker"]}) == {
        "settings.bootstrap_servers[0]": ["'broker' is not host:port"]
    }


def test_sasl_needs_mechanism_and_username_and_keeps_the_password_secret():
    assert set(
        errors("kafka", {"bootstrap_servers": ["a:1"], "security_protocol": "SASL_SSL"})
    ) == {
        "settings.sasl_mechanism",
        "settings.sasl_username",
    }
    settings, secrets = validate_connection(
        "kafka",
        {
            "bootstrap_servers": ["a:1"],
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "svc",
        },
        {"sasl_password": "hunter2"},
    )
    assert "hunter2" not in repr(settings)
    config = kafka_client_config(settings, secrets)
    assert config["sasl_plain_password"] == "hunter2"
    assert config["sasl_mechanism"] == "SCRAM-SHA-512"


def test_unknown_secret_names_are_rejected():
    assert errors("kafka", {"bootstrap_servers": ["a:1"]}, {"pasword": "x"}) == {
        "secrets.pasword": ["unknown field"]
    }


def test_a_password_inside_a_postgres_dsn_moves_to_the_secrets():
    settings, secrets = validate_connection(
        "postgres", {"dsn": "postgresql://app:s3cr%40t@db.internal:5433/sales?sslmode=require"}, {}
    )
    assert settings == {"dsn": "postgresql://app@db.internal:5433/sales?sslmode=require"}
    assert secrets == {"password": "s3cr@t"}
    assert postgres_conninfo(settings, secrets) == {
        **CONNECT_DEFAULTS,
        "host": "db.internal",
        "port": "5433",
        "dbname": "sales",
        "user": "app",
        "sslmode": "require",
        "password": "s3cr@t",
        "options": "-c statement_timeout=600000",
    }


def test_postgres_dsn_must_name_host_and_database():
    assert "settings.dsn" in errors("postgres", {"dsn": "postgresql://app@db.internal"})
    assert "settings.dsn" in errors("postgres", {"dsn": "mysql://x@y/z"})


def test_strip_password_keeps_everything_else():
    assert strip_password("postgresql://u:p@[::1]:5432/db") == "postgresql://u@[::1]:5432/db"
    assert strip_password("postgresql://u@h/db") == "postgresql://u@h/db"


def test_unknown_kind_is_rejected():
    assert errors("mysql", {}) == {
        "kind": ["must be one of kafka, postgres, files, cassandra, schema-registry; got 'mysql'"]
    }


# -- files: a root URI ----------------------------------------------------------------------

LOCAL = ConnectionPolicy(files_dir="/srv")


def root_error(root, policy=LOCAL) -> str:
    with pytest.raises(SpecError) as caught:
        validate_connection("files", {"root": root}, {}, policy)
    problems = caught.value.as_dict()
    assert list(problems) == ["settings.root"], problems
    return problems["settings.root"][0]


@pytest.mark.parametrize(
    ("root", "normalised"),
    [
        ("file:///srv/lake", "file:///srv/lake"),
        ("file:///srv/lake/", "file:///srv/lake"),
        ("file:/srv/lake", "file:///srv/lake"),  # as Hadoop writes local paths
        ("hdfs://namenode:8020/lake/", "hdfs://namenode:8020/lake"),
        ("HDFS://nn.example.com/a/b", "hdfs://nn.example.com/a/b"),
        ("viewfs://cluster/data", "viewfs://cluster/data"),
        ("s3a://my-bucket", "s3a://my-bucket"),
        ("s3a://my-bucket/", "s3a://my-bucket"),
        ("gs://bucket/x/y=1", "gs://bucket/x/y=1"),
        (
            "abfss://lake@acct.dfs.core.windows.net/raw",
            "abfss://lake@acct.dfs.core.windows.net/raw",
        ),
        ("wasbs://c01@acct.blob.core.windows.net/", "wasbs://c01@acct.blob.core.windows.net"),
    ],
)
def test_a_files_root_is_stored_normalised_without_a_trailing_slash(root, normalised):
    settings, secrets = validate_connection("files", {"root": root}, {}, LOCAL)
    assert (settings, secrets) == ({"root": normalised}, {})
    assert files_root(settings) == normalised


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("/srv/lake", "must be a URI such as file:///srv/lake"),
        ("lake", "must be a URI"),
        ("ftp://host/lake", "scheme 'ftp' is not one of file, hdfs, viewfs, s3a, abfs, abfss, gs"),
        ("http://host/lake", "scheme 'http' is not one of"),
        ("file:lake", "must be an absolute path"),
        ("file://host/srv/lake", "a local root names no host"),
        ("file:///srv/../etc", "is not normalised: it has '..'"),
        ("file:///srv/./lake", "is not normalised: it has '.'"),
        ("file:///srv//lake", "is not normalised: it has an empty directory"),
        ("hdfs://nn:8020/a/../b", "is not normalised: it has '..'"),
        ("hdfs://nn:8020/a?user=root", "must not have a ?query or #fragment"),
        ("hdfs://nn:8020/a#x", "must not have a ?query or #fragment"),
        ("hdfs:/lake", "names no host"),
        ("hdfs:///lake", "names no host"),
        ("hdfs://nn:99999/lake", "is not a host name"),
        ("hdfs://nn:8020/a b", "must not contain spaces"),
        ("hdfs://nn:8020/a%2e%2e", "directory 'a%2e%2e' is not allowed"),
        ("hdfs://nn:8020/a:b", "directory 'a:b' is not allowed"),
        ("s3a://AKIA:secret@bucket/x", "must not carry credentials"),
        ("abfss://c:key@acct.dfs.core.windows.net/x", "must not carry credentials"),
        ("hdfs://root@nn:8020/x", "must not carry credentials"),
        ("hdfs://nn:8020/" + "a" * 1100, "is longer than 1024 characters"),
    ],
)
def test_a_files_root_that_is_not_a_plain_uri_of_an_allowed_scheme_is_refused(root, message):
    assert message in root_error(root)


def test_a_files_root_is_required_and_files_connections_have_no_secrets():
    assert errors("files", {}, {"password": "x"}) == {
        "settings.root": ["is required"],
        "secrets.password": ["unknown field"],
    }
    assert errors("files", {"root": "hdfs://nn/x", "dsn": "y"}) == {
        "settings.dsn": ["unknown field"]
    }
