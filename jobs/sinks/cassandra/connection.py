"""The cassandra kind of connection: a cluster's contact points and local data centre, the
keyspace sinks write in, a user and password (the password a secret: write-only, dropped
when the cluster or user changes), TLS files from the certificate directory.

What an editor can reach through one: only the tables of its keyspace (a sink names a table,
never a keyspace; Cassandra's own keyspaces are refused), as the connection's user, whose
grants an admin of the cluster sets. No setting names a file outside the certificate
directory or passes options through to the driver."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...connection_kind import ConnectionKind

if TYPE_CHECKING:
    from ...connections import ConnectionPolicy
    from ...spec.fields import FieldError

SETTINGS = frozenset(
    {
        "contact_points",
        "local_datacenter",
        "keyspace",
        "username",
        "tls",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)
SECRETS = frozenset({"password"})
DEFAULT_PORT = 9042
MAX_CONTACT_POINTS = 16
# An unquoted CQL name (keyspaces and tables are created and quoted by us: lower case).
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_DATACENTER_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HOST_PORT_RE = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?$")
# Cassandra's own keyspaces: roles and their hashes, the schema, tracing; never a sink's.
SYSTEM_KEYSPACES = (
    "system",
    "system_auth",
    "system_schema",
    "system_distributed",
    "system_traces",
    "system_views",
    "system_virtual_schema",
)
# What a password belongs to: the cluster and the user (every setting but the keyspace).
ENDPOINT = tuple(sorted(SETTINGS - {"keyspace"}))


def keyspace_problem(name: str) -> str | None:
    if not NAME_RE.fullmatch(name):
        return (
            f"{name!r} is not a keyspace name: 1-48 lower-case letters, digits and underscores,"
            " starting with a letter"
        )
    if name in SYSTEM_KEYSPACES or name.startswith("system_"):
        return f"{name!r} is one of Cassandra's own keyspaces; a sink may not write there"
    return None


def validate(
    errors: list[FieldError], data: Any, secrets: Any, policy: ConnectionPolicy
) -> tuple[dict[str, Any], dict[str, str]]:
    from ...connections import secrets_section, tls_files
    from ...spec.fields import Section

    s = Section(errors, "settings", data, set(SETTINGS))
    points = s.get("contact_points")
    if isinstance(points, str):
        points = [p.strip() for p in points.split(",") if p.strip()]
    clean: dict[str, Any] = {}
    if points is not None:
        if not isinstance(points, list) or not points:
            s.error("contact_points", "must be a non-empty list of host:port")
        elif len(points) > MAX_CONTACT_POINTS:
            s.error("contact_points", f"at most {MAX_CONTACT_POINTS} contact points")
        else:
            out = []
            for i, point in enumerate(points):
                match = _HOST_PORT_RE.fullmatch(point) if isinstance(point, str) else None
                port = int(match.group(2) or DEFAULT_PORT) if match else 0
                if not match or not 0 < port < 65536:
                    s.error(f"contact_points[{i}]", f"{point!r} is not host:port")
                else:
                    out.append(f"{match.group(1)}:{port}")
            clean["contact_points"] = out
    datacenter = s.string("local_datacenter")
    if datacenter is not None and not _DATACENTER_RE.fullmatch(datacenter):
        s.error("local_datacenter", f"{datacenter!r} is not a data centre name")
    elif datacenter is not None:
        clean["local_datacenter"] = datacenter
    keyspace = s.string("keyspace")
    if keyspace is not None and (problem := keyspace_problem(keyspace)):
        s.error("keyspace", problem)
    elif keyspace is not None:
        clean["keyspace"] = keyspace
    username = s.string("username", None)
    if username is not None:
        clean["username"] = username
    tls = s.boolean("tls", False)
    clean["tls"] = bool(tls)
    tls_files(s, clean, policy, None if tls else "applies with tls: true only")
    if (
        tls
        and "ssl_cafile" not in clean
        and not any(e.field.endswith("ssl_cafile") for e in errors)
    ):
        s.error(
            "ssl_cafile", "is required with tls: true (the CA that signed the nodes' certificates)"
        )
    if ("ssl_certfile" in clean) != ("ssl_keyfile" in clean):
        s.error("ssl_keyfile", "ssl_certfile and ssl_keyfile go together (a client certificate)")
    check_hostname = s.boolean("ssl_check_hostname", None)
    if check_hostname is not None:
        clean["ssl_check_hostname"] = check_hostname
    clean_secrets = secrets_section(errors, secrets, set(SECRETS))
    if clean_secrets.get("password") and username is None:
        s.error("username", "is required with a password")
    return clean, clean_secrets


def endpoint(settings: Mapping[str, Any], policy: Any = None) -> tuple:
    """The cluster and the user a password belongs to (not the keyspace)."""
    return tuple(tuple(v) if isinstance(v := settings.get(name), list) else v for name in ENDPOINT)


def target(settings: Mapping[str, Any]) -> str:
    points = ", ".join(settings.get("contact_points") or [])
    return f"{points} / {settings.get('keyspace', '')}"


KIND = ConnectionKind("cassandra", SETTINGS, SECRETS, validate, endpoint, target)


def client_arguments(settings: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """What a driver is given to reach the cluster (the Java writer's connection part, and
    this module's `session`), the password included (the run configuration is 0600)."""
    tls = None
    if settings.get("tls"):
        tls = {
            "ca_file": settings.get("ssl_cafile"),
            "cert_file": settings.get("ssl_certfile"),
            "key_file": settings.get("ssl_keyfile"),
            "hostname_validation": settings.get("ssl_check_hostname", True),
        }
    return {
        "contact_points": list(settings.get("contact_points") or []),
        "local_datacenter": settings.get("local_datacenter"),
        "keyspace": settings.get("keyspace"),
        "username": settings.get("username"),
        "password": secrets.get("password"),
        "tls": tls,
    }


def session(arguments: Mapping[str, Any], timeout: float = 10.0):
    """A cassandra-driver Session of the cluster (token-aware, the local data centre first),
    in the connection's keyspace; close it with `session.cluster.shutdown()`. Raises the
    driver's NoHostAvailable (its `errors` say why per host: AuthenticationFailed...)."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    points = []
    for point in arguments["contact_points"]:
        host, _, port = point.rpartition(":")
        points.append((host.strip("[]"), int(port)))
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=arguments["local_datacenter"])
        ),
        request_timeout=timeout,
    )
    auth = None
    if arguments.get("username"):
        auth = PlainTextAuthProvider(arguments["username"], arguments.get("password") or "")
    cluster = Cluster(
        points,
        auth_provider=auth,
        ssl_context=_ssl_context(arguments.get("tls")),
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
    )
    try:
        return cluster.connect(arguments.get("keyspace"))
    except BaseException:
        cluster.shutdown()
        raise


def _ssl_context(tls: Mapping[str, Any] | None) -> ssl.SSLContext | None:
    if not tls:
        return None
    context = ssl.create_default_context(cafile=tls.get("ca_file"))
    context.check_hostname = bool(tls.get("hostname_validation", True))
    if tls.get("cert_file"):
        context.load_cert_chain(tls["cert_file"], tls.get("key_file"))
    return context
