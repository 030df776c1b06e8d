"""Connection settings: what a Kafka cluster, a Postgres target or a file system root needs,
validated in one place.

A connection is stored once in the control plane and referenced by name from pipelines. Its
non-secret `settings` may be shown; its `secrets` (passwords) never are. The same module turns
a connection into client arguments inside the Spark job. Plain Python, no Django.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from .connection_kind import ConnectionKind
from .kafka.names import internal_problem, is_internal
from .registry.connection import KIND as SCHEMA_REGISTRY
from .sinks.cassandra.connection import KIND as CASSANDRA
from .spec.validate import FieldError, Section, SpecError

log = logging.getLogger("jobs.connections")

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
FILES_SETTINGS = {"root"}
# Where a files connection's root may be: the local file system, or what Hadoop's FileSystem
# reaches with the cluster's own configuration (credentials are never part of a root).
FILES_SCHEMES = ("file", "hdfs", "viewfs", "s3a", "abfs", "abfss", "gs", "wasbs")

_HOST_PORT_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
_HOST_RE = re.compile(r"^([0-9a-fA-F:]+|[A-Za-z0-9._-]+)$")
# What a Kafka client id may be (the characters Kafka itself once required of one): it is
# written into the broker's request logs and quota metrics as it is.
_CLIENT_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def validate_connection(
    kind: str, settings: Any, secrets: Any, policy: ConnectionPolicy | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """Clean `settings` and `secrets` for a connection of `kind`, or raise SpecError.

    A password embedded in a Postgres DSN is moved into the secrets, so the stored DSN can
    be shown to anyone who may read the connection. `policy`: what this installation allows
    (TLS files from one directory, Unix sockets, local roots under one directory); the
    default allows none of them.
    """
    policy = policy or ConnectionPolicy()
    errors: list[FieldError] = []
    if kind not in CONNECTION_KINDS:
        raise SpecError([FieldError("kind", f"must be one of {', '.join(KINDS)}; got {kind!r}")])
    clean, clean_secrets = CONNECTION_KINDS[kind].validate(errors, settings, secrets, policy)
    if errors:
        raise SpecError(errors)
    return clean, clean_secrets


def secrets_section(errors: list[FieldError], data: Any, allowed: set[str]) -> dict[str, str]:
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


def _kafka(errors: list[FieldError], data: Any, secrets: Any, policy: ConnectionPolicy):
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
                match = _HOST_PORT_RE.fullmatch(server) if isinstance(server, str) else None
                if not match or not 0 < int(match.group(2)) < 65536:
                    s.error(f"bootstrap_servers[{i}]", f"{server!r} is not host:port")
    protocol = s.string("security_protocol", "PLAINTEXT", choices=SECURITY_PROTOCOLS)
    mechanism = s.string("sasl_mechanism", None, choices=SASL_MECHANISMS)
    username = s.string("sasl_username", None)
    clean: dict[str, Any] = {"bootstrap_servers": servers, "security_protocol": protocol}
    tls_files(s, clean, policy)
    client_id = s.string("client_id", None)
    if client_id is not None and not _CLIENT_ID_RE.fullmatch(client_id):
        s.error("client_id", f"must be 1-249 letters, digits, '.', '_' or '-'; got {client_id!r}")
    elif client_id is not None and (problem := internal_problem("client id", client_id)):
        s.error("client_id", problem)
    elif client_id is not None:
        clean["client_id"] = client_id
    check_hostname = s.boolean("ssl_check_hostname", None)
    if check_hostname is not None:
        clean["ssl_check_hostname"] = check_hostname
    clean_secrets = secrets_section(errors, secrets, KAFKA_SECRETS)
    if protocol and protocol.startswith("SASL"):
        if mechanism is None:
            s.error("sasl_mechanism", f"is required with security_protocol {protocol}")
        if username is None:
            s.error("sasl_username", f"is required with security_protocol {protocol}")
        clean.update(sasl_mechanism=mechanism, sasl_username=username)
    elif mechanism or username:
        s.error("sasl_mechanism", "SASL settings need security_protocol SASL_PLAINTEXT or SASL_SSL")
    return clean, clean_secrets


# What a Postgres DSN may say. Everything else libpq understands is refused by name: several
# parameters read or write local files (passfile, sslkey, sslcert, sslkeylogfile, service),
# others reroute the connection (hostaddr, a host list, a Unix socket directory) or would let
# a spec reach the control plane's own database or the host it runs on.
POSTGRES_DSN_PARAMS = (
    "sslmode",
    "sslrootcert",
    "connect_timeout",
    "application_name",
    "options",
)
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# `options` may only set the search_path: `-c search_path=a,b`.
_OPTIONS_RE = re.compile(r"^-c\s*search_path=[A-Za-z_][A-Za-z0-9_$]*(,[A-Za-z_][A-Za-z0-9_$]*)*$")
_APPLICATION_NAME_RE = re.compile(r"^[\x20-\x7e]{1,63}$")
# Every connection the control plane or a job opens to a Postgres target: nothing is read from
# the host's own files (~/.pgpass, ~/.postgresql/postgresql.crt, Kerberos caches), and a dead
# peer is noticed by TCP keepalives instead of a connection hanging forever.
CONNECT_DEFAULTS = {
    "connect_timeout": "10",
    "passfile": os.devnull,
    "sslcertmode": "disable",
    "gssencmode": "disable",
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}


STATEMENT_TIMEOUT_MS = 600_000


@dataclass(frozen=True)
class ConnectionPolicy:
    """What the operator of this control plane allows connections to use. `cert_dir`: the
    directory that TLS files (sslrootcert, Kafka's ssl_*file) must come from; None: no TLS
    files at all. `allow_unix_sockets`: whether a Postgres host may be a socket directory.
    `files_dir`: the directory that a files connection's local (file:) root must be in;
    None: no local roots at all."""

    cert_dir: str | None = None
    allow_unix_sockets: bool = False
    files_dir: str | None = None


def _postgres(errors: list[FieldError], data: Any, secrets: Any, policy: ConnectionPolicy):
    s = Section(errors, "settings", data, POSTGRES_SETTINGS)
    clean_secrets = secrets_section(errors, secrets, POSTGRES_SECRETS)
    dsn = s.string("dsn")
    if dsn is None:
        return {}, clean_secrets
    try:
        params = parse_postgres_dsn(dsn, policy)
    except ValueError as exc:
        s.error("dsn", str(exc))
        return {}, clean_secrets
    if params.get("password") is not None:
        clean_secrets.setdefault("password", params["password"])
    return {"dsn": strip_password(dsn)}, clean_secrets


def parse_postgres_dsn(dsn: str, policy: ConnectionPolicy | None = None) -> dict[str, str]:
    """The libpq parameters a postgresql:// URL names, checked against the allow-list; raises
    ValueError with a message naming the problem (for `settings.dsn`)."""
    policy = policy or ConnectionPolicy()
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("must be a postgresql://user@host:port/dbname URL")
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    netloc_host = parts.netloc.rpartition("@")[2]
    if "," in netloc_host:
        raise ValueError("names several hosts; give exactly one")
    if netloc_host.startswith("["):
        host = netloc_host[1 : netloc_host.find("]")]
    else:
        host = unquote(netloc_host.rsplit(":", 1)[0] if ":" in netloc_host else netloc_host)
    if not host:
        raise ValueError("names no host")
    if host.startswith(("/", "@")):
        if not policy.allow_unix_sockets:
            raise ValueError(
                f"host {host!r} is a Unix socket; sockets are not allowed here (an admin "
                "can allow them with CONTROLPLANE_ALLOW_UNIX_SOCKETS)"
            )
    elif not _HOST_RE.fullmatch(host):
        raise ValueError(f"host {host!r} is not a host name or IP address")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    dbname = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
    if not dbname:
        raise ValueError("names no database")
    if "/" in dbname or "\x00" in dbname:
        raise ValueError(f"database name {dbname!r} is not valid")
    out = {"host": host, "port": str(port or 5432), "dbname": dbname}
    if parts.username:
        out["user"] = unquote(parts.username)
    if parts.password is not None:
        out["password"] = unquote(parts.password)
    seen: set[str] = set()
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in seen:
            raise ValueError(f"sets the parameter {name!r} twice")
        seen.add(name)
        if name in ("host", "hostaddr", "port", "dbname", "user", "password"):
            raise ValueError(
                f"parameter {name!r} is not allowed in the query string: give the "
                "host, port, database and user in the URL itself (postgresql://user@host:port/db)"
                if name != "password"
                else "parameter 'password' is not allowed in the URL: use the password secret"
            )
        if name not in POSTGRES_DSN_PARAMS:
            raise ValueError(
                f"parameter {name!r} is not allowed (allowed: {', '.join(POSTGRES_DSN_PARAMS)})"
            )
        out[name] = _postgres_param(name, value, policy)
    return out


def _postgres_param(name: str, value: str, policy: ConnectionPolicy) -> str:
    if name == "sslmode":
        if value not in SSL_MODES:
            raise ValueError(f"sslmode {value!r} is not one of {', '.join(SSL_MODES)}")
    elif name == "sslrootcert":
        if value != "system":  # libpq: the operating system's trusted CAs
            return cert_path(value, policy, "sslrootcert")
    elif name == "connect_timeout":
        if not value.isdigit() or not 1 <= int(value) <= 300:
            raise ValueError("connect_timeout must be a whole number of seconds from 1 to 300")
    elif name == "application_name":
        if not _APPLICATION_NAME_RE.fullmatch(value):
            raise ValueError("application_name must be 1-63 printable ASCII characters")
    elif name == "options" and not _OPTIONS_RE.match(value.strip()):
        raise ValueError(
            "options may only set the search_path, e.g. options=-c search_path=sales,public"
        )
    return value.strip() if name == "options" else value


# -- files: a root URI ----------------------------------------------------------------------

# A directory of a root: no percent-encoding (Hadoop and Python decode it differently), no
# spaces, colons or backslashes (Hadoop's Path refuses or splits on them).
_ROOT_SEGMENT_RE = re.compile(r"^[A-Za-z0-9._~@+=,-]+$")
# hdfs://namenode:8020, viewfs://cluster, s3a://bucket, gs://bucket.
_ROOT_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,253}[A-Za-z0-9])?(:[0-9]{1,5})?$")
# abfs(s)://container@account.dfs.core.windows.net, wasbs://container@account.blob...
_AZURE_HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{1,61}[a-z0-9])?@[A-Za-z0-9.-]{1,253}$")
_AZURE_SCHEMES = ("abfs", "abfss", "wasbs")
MAX_ROOT_LENGTH = 1024


def _files(errors: list[FieldError], data: Any, secrets: Any, policy: ConnectionPolicy):
    s = Section(errors, "settings", data, FILES_SETTINGS)
    clean_secrets = secrets_section(errors, secrets, set())
    root = s.string("root")
    if root is None:
        return {}, clean_secrets
    try:
        return {"root": check_files_root(root, policy)}, clean_secrets
    except ValueError as exc:
        s.error("root", str(exc))
        return {}, clean_secrets


def files_root(settings: Mapping[str, Any]) -> str:
    """A files connection's root, normalised, without a trailing slash (`file:///srv/lake`,
    `hdfs://nn:8020/lake`, `s3a://bucket`): what the job joins the sink's path to. Checks the
    URI's form only (see check_files_root for the policy); raises ValueError."""
    root = settings.get("root")
    if not isinstance(root, str) or not root:
        raise ValueError("is required")
    scheme, netloc, path = _split_root(root)
    return f"{scheme}://{netloc}{path}"


def check_files_root(root: str, policy: ConnectionPolicy | None = None) -> str:
    """`root` normalised (files_root), and allowed by `policy`: a local root must be inside
    its `files_dir` (symbolic links resolved). Raises ValueError naming the problem (for
    `settings.root`)."""
    policy = policy or ConnectionPolicy()
    normalised = files_root({"root": root})
    scheme, _, path = _split_root(root)
    if scheme == "file":
        path = path or "/"
        if not policy.files_dir:
            raise ValueError(
                "local (file:) roots are not allowed until an admin sets CONTROLPLANE_FILES_DIR"
                " to the directory they must be in"
            )
        base = os.path.realpath(policy.files_dir)
        real = os.path.realpath(path)
        if os.path.commonpath([base, real]) != base:
            raise ValueError(
                f"{path!r} is not inside {base}, the directory local roots must be in"
                " (CONTROLPLANE_FILES_DIR)"
            )
    return normalised


def _split_root(root: str) -> tuple[str, str, str]:
    """(scheme, host, absolute path without a trailing slash, "" for the top) of a root URI;
    raises ValueError."""
    example = "a URI such as file:///srv/lake or hdfs://namenode:8020/lake"
    if len(root) > MAX_ROOT_LENGTH:
        raise ValueError(f"is longer than {MAX_ROOT_LENGTH} characters")
    if any(c.isspace() or not c.isprintable() for c in root):
        raise ValueError("must not contain spaces or control characters")
    scheme, sep, rest = root.partition(":")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        raise ValueError(f"must be {example}")
    scheme = scheme.lower()
    if scheme not in FILES_SCHEMES:
        raise ValueError(f"scheme {scheme!r} is not one of {', '.join(FILES_SCHEMES)}")
    if "?" in rest or "#" in rest:
        raise ValueError("must not have a ?query or #fragment")
    if rest.startswith("//"):
        netloc, slash, path = rest[2:].partition("/")
        path = slash + path
    elif scheme == "file":
        netloc, path = "", rest  # file:/srv/lake, as Hadoop writes local paths
    else:
        raise ValueError(f"names no host: {scheme}://host/path")
    if scheme == "file":
        if netloc:
            raise ValueError(f"a local root names no host: file:///path, not file://{netloc}/")
        if not path.startswith("/"):
            raise ValueError("must be an absolute path: file:///srv/lake")
    else:
        if not netloc:
            raise ValueError(f"names no host: {scheme}://host/path")
        user, at, host = netloc.rpartition("@")
        if at and (scheme not in _AZURE_SCHEMES or ":" in user):
            raise ValueError(
                "must not carry credentials (user:password@): the cluster's Hadoop"
                " configuration gives them"
            )
        match = (_AZURE_HOST_RE if at else _ROOT_HOST_RE).match(netloc)
        port = netloc.rpartition(":")[2] if ":" in host else None
        if not match or (port is not None and not 0 < int(port) < 65536):
            raise ValueError(f"host {netloc!r} is not a host name (with an optional :port)")
        if path and not path.startswith("/"):
            raise ValueError(f"must be an absolute path: {scheme}://{netloc}/path")
    if "//" in path:
        raise ValueError(f"path {path!r} is not normalised: it has an empty directory ('//')")
    segments = [x for x in path.split("/") if x != ""]
    for segment in segments:
        if segment in (".", ".."):
            raise ValueError(f"path {path!r} is not normalised: it has {segment!r}")
        if not _ROOT_SEGMENT_RE.fullmatch(segment):
            raise ValueError(
                f"directory {segment!r} is not allowed: use letters, digits and . _ - ~ @ + = ,"
            )
    return scheme, netloc, "".join(f"/{x}" for x in segments)


TLS_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


def tls_files(
    s: Section, clean: dict[str, Any], policy: ConnectionPolicy, refused: str | None = None
) -> None:
    """The TLS files a connection names (a CA, a client certificate and its key), each in the
    certificate directory, into `clean`; `refused`: why none may be named here, if so."""
    for name in TLS_FILES:
        value = s.string(name, None)
        if value is not None and refused:
            s.error(name, refused)
        elif value is not None:
            try:
                clean[name] = cert_path(value, policy, name)
            except ValueError as exc:
                s.error(name, str(exc).removeprefix(f"{name}: "))


def cert_path(value: str, policy: ConnectionPolicy, field_name: str) -> str:
    """A TLS file named by a connection: inside the configured directory, or refused."""
    if not policy.cert_dir:
        raise ValueError(
            f"{field_name}: TLS files are not allowed until an admin sets CONTROLPLANE_CERT_DIR"
        )
    base = os.path.realpath(policy.cert_dir)
    path = os.path.realpath(os.path.join(base, value))
    if os.path.commonpath([base, path]) != base or path == base:
        raise ValueError(f"{field_name}: {value!r} is not a file in the certificate directory")
    if not os.path.isfile(path):
        raise ValueError(f"{field_name}: {value!r} does not exist in the certificate directory")
    return path


def strip_password(dsn: str) -> str:
    """The DSN without its password (safe to show and to log)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    user = quote(unquote(parts.username or ""), safe="")
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{user}@{host}" if user else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def postgres_conninfo(
    settings: Mapping[str, Any],
    secrets: Mapping[str, str],
    policy: ConnectionPolicy | None = None,
) -> dict[str, Any]:
    """Keyword arguments for psycopg.connect(): every parameter spelled out (the stored DSN is
    parsed and checked again against `policy`, so nothing outside the allow-list reaches
    libpq), the password kept apart, and CONNECT_DEFAULTS where the DSN does not say
    otherwise. Raises ValueError if the DSN is not allowed (any more)."""
    params = parse_postgres_dsn(settings["dsn"], policy)
    params.pop("password", None)
    kwargs: dict[str, Any] = {**CONNECT_DEFAULTS, **params}
    # A statement that waits far longer than any batch should (a lock held by someone else)
    # ends with an error instead of holding the sink forever.
    kwargs["options"] = " ".join(
        filter(None, [f"-c statement_timeout={STATEMENT_TIMEOUT_MS}", params.get("options")])
    )
    if secrets.get("password"):
        kwargs["password"] = secrets["password"]
    return kwargs


def kafka_client_config(settings: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for kafka-python clients (KafkaConsumer, KafkaAdminClient...)."""
    config: dict[str, Any] = {
        "bootstrap_servers": list(settings["bootstrap_servers"]),
        "security_protocol": settings.get("security_protocol", "PLAINTEXT"),
    }
    client_id = settings.get("client_id")
    if client_id and is_internal(str(client_id)):
        # Refused on save; one stored by an earlier version never reaches the broker (the
        # client's default id is used), wherever the connection is used from.
        log.warning("client_id %r is Kafka's own: not used (the default is)", client_id)
    elif client_id:
        config["client_id"] = client_id
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


# -- the kinds of connection -----------------------------------------------------------------

# What identifies the far end of a connection: a change to any of these is a new endpoint,
# and the stored secrets are dropped (they belong to the old one).
KAFKA_ENDPOINT = tuple(sorted(KAFKA_SETTINGS - {"client_id"}))
POSTGRES_ENDPOINT = ("host", "port", "dbname", "user", "sslmode", "sslrootcert")


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _kafka_endpoint(settings: Mapping[str, Any], policy: ConnectionPolicy) -> tuple:
    return tuple(_frozen(settings.get(name)) for name in KAFKA_ENDPOINT)


def _postgres_endpoint(settings: Mapping[str, Any], policy: ConnectionPolicy) -> tuple:
    try:
        params = parse_postgres_dsn(settings.get("dsn") or "", policy)
    except ValueError:
        return ("unparsable", settings.get("dsn"))
    return tuple(params.get(name) for name in POSTGRES_ENDPOINT)


CONNECTION_KINDS: dict[str, ConnectionKind] = {
    k.name: k
    for k in (
        ConnectionKind(
            "kafka",
            frozenset(KAFKA_SETTINGS),
            frozenset(KAFKA_SECRETS),
            _kafka,
            _kafka_endpoint,
            lambda settings: ", ".join(settings.get("bootstrap_servers") or []),
        ),
        ConnectionKind(
            "postgres",
            frozenset(POSTGRES_SETTINGS),
            frozenset(POSTGRES_SECRETS),
            _postgres,
            _postgres_endpoint,
            lambda settings: settings.get("dsn") or "",
        ),
        ConnectionKind(
            "files",
            frozenset(FILES_SETTINGS),
            frozenset(),
            _files,
            lambda settings, policy: (settings.get("root"),),
            lambda settings: settings.get("root") or "",
            holds_directories=True,
        ),
        CASSANDRA,
        SCHEMA_REGISTRY,
    )
}
KINDS = tuple(CONNECTION_KINDS)
SECRET_FIELDS = {k.name: set(k.secrets) for k in CONNECTION_KINDS.values()}
