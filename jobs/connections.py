"""Connection settings: what a Kafka cluster or a Postgres target needs, validated in one place.

A connection is stored once in the control plane and referenced by name from pipelines. Its
non-secret `settings` may be shown; its `secrets` (passwords) never are. The same module turns
a connection into client arguments inside the Spark job. Plain Python, no Django.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from .spec.validate import FieldError, Section, SpecError

KINDS = ("kafka", "postgres")

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
KAFKA_SETTINGS = {
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_check_hostname",
    "client_id",
}
KAFKA_SECRETS = {"sasl_password", "ssl_password"}
POSTGRES_SETTINGS = {"dsn"}
POSTGRES_SECRETS = {"password"}
SECRET_FIELDS = {"kafka": KAFKA_SECRETS, "postgres": POSTGRES_SECRETS}

_HOST_PORT_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")


def validate_connection(
    kind: str, settings: Any, secrets: Any
) -> tuple[dict[str, Any], dict[str, str]]:
    """Clean `settings` and `secrets` for a connection of `kind`, or raise SpecError.

    A password embedded in a Postgres DSN is moved into the secrets, so the stored DSN can
    be shown to anyone who may read the connection.
    """
    errors: list[FieldError] = []
    if kind not in KINDS:
        raise SpecError([FieldError("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")])
    if kind == "kafka":
        clean, clean_secrets = _kafka(errors, settings, secrets)
    else:
        clean, clean_secrets = _postgres(errors, settings, secrets)
    if errors:
        raise SpecError(errors)
    return clean, clean_secrets


def _secrets(errors: list[FieldError], data: Any, allowed: set[str]) -> dict[str, str]:
    s = Section(errors, "secrets", data if data is not None else {}, allowed)
    out = {}
    for name in sorted(allowed):
        value = s.data.get(name)
        if value is None:
            continue
        if not isinstance(value, str) or value == "":
            s.error(name, "must be a non-empty string")
        else:
            out[name] = value
    return out


def _kafka(errors: list[FieldError], data: Any, secrets: Any):
    s = Section(errors, "settings", data, KAFKA_SETTINGS)
    servers = s.get("bootstrap_servers")
    if isinstance(servers, str):
        servers = [part.strip() for part in servers.split(",") if part.strip()]
    if servers is not None:
        if not isinstance(servers, list) or not servers:
            s.error("bootstrap_servers", "must be a non-empty list of host:port")
            servers = None
        else:
            for i, server in enumerate(servers):
                match = _HOST_PORT_RE.match(server) if isinstance(server, str) else None
                if not match or not 0 < int(match.group(2)) < 65536:
                    s.error(f"bootstrap_servers[{i}]", f"{server!r} is not host:port")
    protocol = s.string("security_protocol", "PLAINTEXT", choices=SECURITY_PROTOCOLS)
    mechanism = s.string("sasl_mechanism", None, choices=SASL_MECHANISMS)
    username = s.string("sasl_username", None)
    clean: dict[str, Any] = {"bootstrap_servers": servers, "security_protocol": protocol}
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "client_id"):
        value = s.string(name, None)
        if value is not None:
            clean[name] = value
    check_hostname = s.boolean("ssl_check_hostname", None)
    if check_hostname is not None:
        clean["ssl_check_hostname"] = check_hostname
    clean_secrets = _secrets(errors, secrets, KAFKA_SECRETS)
    if protocol and protocol.startswith("SASL"):
        if mechanism is None:
            s.error("sasl_mechanism", f"is required with security_protocol {protocol}")
        if username is None:
            s.error("sasl_username", f"is required with security_protocol {protocol}")
        clean.update(sasl_mechanism=mechanism, sasl_username=username)
    elif mechanism or username:
        s.error("sasl_mechanism", "SASL settings need security_protocol SASL_PLAINTEXT or SASL_SSL")
    return clean, clean_secrets


def _postgres(errors: list[FieldError], data: Any, secrets: Any):
    s = Section(errors, "settings", data, POSTGRES_SETTINGS)
    clean_secrets = _secrets(errors, secrets, POSTGRES_SECRETS)
    dsn = s.string("dsn")
    if dsn is None:
        return {}, clean_secrets
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        s.error("dsn", "must be a postgresql://user@host:port/dbname URL")
        return {}, clean_secrets
    if not parts.hostname:
        s.error("dsn", "names no host")
    if not parts.path.strip("/"):
        s.error("dsn", "names no database")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        s.error("dsn", "has an invalid port")
    if parts.password is not None:
        clean_secrets.setdefault("password", unquote(parts.password))
    return {"dsn": strip_password(dsn)}, clean_secrets


def strip_password(dsn: str) -> str:
    """The DSN without its password (safe to show and to log)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    user = quote(unquote(parts.username or ""), safe="")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}@{host}" if user else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def postgres_conninfo(settings: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for psycopg.connect(): the DSN plus the password kept apart."""
    kwargs: dict[str, Any] = {"conninfo": settings["dsn"]}
    if secrets.get("password"):
        kwargs["password"] = secrets["password"]
    return kwargs


def kafka_client_config(settings: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for kafka-python clients (KafkaConsumer, KafkaAdminClient...)."""
    config: dict[str, Any] = {
        "bootstrap_servers": list(settings["bootstrap_servers"]),
        "security_protocol": settings.get("security_protocol", "PLAINTEXT"),
    }
    if settings.get("client_id"):
        config["client_id"] = settings["client_id"]
    if config["security_protocol"].startswith("SASL"):
        config["sasl_mechanism"] = settings["sasl_mechanism"]
        config["sasl_plain_username"] = settings["sasl_username"]
        config["sasl_plain_password"] = secrets.get("sasl_password")
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"):
        if name in settings:
            config[name] = settings[name]
    if secrets.get("ssl_password"):
        config["ssl_password"] = secrets["ssl_password"]
    return config
