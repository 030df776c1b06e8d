"""Connection settings validation and client arguments: pure logic."""

from __future__ import annotations

import pytest

from jobs.connections import (
    CONNECT_DEFAULTS,
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
    assert errors("mysql", {}) == {"kind": ["must be one of kafka, postgres; got 'mysql'"]}
