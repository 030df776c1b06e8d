"""What a connection may point at, and what happens to its secrets when that changes.

`jobs.connections` checks a connection's own settings (the DSN allow-list, TLS files from one
directory, local file roots under one directory). This module adds what only the control
plane knows:

- **The control plane's own database is off limits.** A Postgres connection that resolves to
  the same server (by address, through DNS names, loopback and this host's own addresses, or
  the Unix socket) and the same database as the control plane is refused: a pipeline writing
  there could forge commit markers, users or tokens.
- **The control plane's own directories are off limits.** A files connection whose local root
  is, holds or is inside the checkpoint root (restore points included) or the runs root is
  refused, judged by canonical locations (controlplane.connections.directories).
- **A files root cannot move under its pipelines.** Changing a files connection's root
  re-checks every pipeline using it against every other files sink: a change that would make
  two share a directory is refused (directories.RootInUse).
- **Secrets follow their endpoint.** A stored password is only ever sent to the endpoint it
  was entered for: changing where a connection points (host, port, database, user, brokers,
  security protocol, TLS trust) drops the stored secrets unless new ones come with the change.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.db import connection as db_connection

from jobs.connections import (
    CONNECTION_KINDS,
    ConnectionPolicy,
    check_files_root,
    parse_postgres_dsn,
    postgres_conninfo,
    validate_connection,
)
from jobs.registry.connection import client_arguments as registry_client_arguments
from jobs.sinks.cassandra.connection import client_arguments as cassandra_client_arguments
from jobs.spec import FieldError, SpecError
from jobs.spec.locations import LocationError, location

from .directories import control_plane_overlap, root_change_conflicts


def connection_policy() -> ConnectionPolicy:
    return ConnectionPolicy(
        cert_dir=django_settings.CONTROLPLANE_CERT_DIR or None,
        allow_unix_sockets=django_settings.CONTROLPLANE_ALLOW_UNIX_SOCKETS,
        files_dir=django_settings.CONTROLPLANE_FILES_DIR or None,
    )


@dataclass(frozen=True)
class Cleaned:
    settings: dict[str, Any]
    secrets: dict[str, str]
    dropped: tuple[str, ...] = ()  # stored secrets dropped because the endpoint changed


def clean_connection(
    kind: str,
    settings: Any,
    submitted_secrets: Mapping[str, Any] | None,
    *,
    stored_settings: Mapping[str, Any] | None = None,
    stored_secrets: Mapping[str, str] | None = None,
    connection: Any = None,
) -> Cleaned:
    """Validate a new or changed connection; raises SpecError naming each problem.

    `submitted_secrets`: the secrets given with this change (a value of None removes one);
    the stored ones are kept for what is not mentioned, unless the endpoint changed.
    `connection`: the stored connection being changed, if any: a files root that moves is
    checked against the pipelines using it (raises directories.RootInUse, a SpecError on
    `settings.root`; the saver checks again under lock, see directories).
    """
    secrets = dict(stored_secrets or {})
    try:
        new_settings, _ = validate_connection(kind, settings, {}, connection_policy())
    except SpecError:
        new_settings = None  # reported below, together with any problem of the secrets
    dropped: tuple[str, ...] = ()
    moved = (
        stored_settings is not None
        and new_settings is not None
        and endpoint(kind, stored_settings) != endpoint(kind, new_settings)
    )
    if moved and secrets:
        dropped = tuple(sorted(k for k in secrets if k not in (submitted_secrets or {})))
        secrets = {}
    for key, value in (submitted_secrets or {}).items():
        if value is None:
            secrets.pop(key, None)
        else:
            secrets[key] = value
    clean_settings, clean_secrets = validate_connection(
        kind, settings, secrets, connection_policy()
    )
    # What only the control plane knows of: its own database, services and directories.
    if clean_settings.get("url"):
        problem = control_plane_service_problem(clean_settings["url"])
        if problem:
            raise SpecError([FieldError("settings.url", problem)])
    if clean_settings.get("dsn"):
        problem = control_plane_database_problem(clean_settings["dsn"])
        if problem:
            raise SpecError([FieldError("settings.dsn", problem)])
    if CONNECTION_KINDS[kind].holds_directories and clean_settings.get("root"):
        problem = control_plane_directory_problem(clean_settings["root"])
        if problem:
            raise SpecError([FieldError("settings.root", problem)])
        if connection is not None:
            conflict = root_change_conflicts(connection, clean_settings["root"], lock=False)
            if conflict is not None:
                raise conflict
    dropped = tuple(k for k in dropped if k not in clean_secrets)
    return Cleaned(clean_settings, clean_secrets, dropped)


def postgres_connect_arguments(
    settings: Mapping[str, Any], secrets: Mapping[str, str]
) -> dict[str, Any]:
    """psycopg.connect() arguments for a stored Postgres connection, checked again (the
    policy or the control plane's database may have changed since it was saved); raises
    ValueError saying what is wrong with its `settings.dsn`."""
    problem = control_plane_database_problem(settings.get("dsn", ""))
    if problem:
        raise ValueError(problem)
    return postgres_conninfo(settings, secrets, connection_policy())


def cassandra_connection_arguments(
    settings: Mapping[str, Any], secrets: Mapping[str, str]
) -> dict[str, Any]:
    """What a driver or the control plane is given to reach a stored cassandra connection,
    checked again (the policy may have changed since it was saved: TLS files from the
    certificate directory); raises ValueError saying what is wrong."""
    clean, _ = validate_connection("cassandra", dict(settings), {}, connection_policy())
    return cassandra_client_arguments(clean, secrets)


def registry_connection_arguments(
    settings: Mapping[str, Any], secrets: Mapping[str, str]
) -> dict[str, Any]:
    """What a driver or the control plane is given to reach a stored schema-registry
    connection, checked again against the policy (raises ValueError naming the problem)."""
    try:
        clean, _ = validate_connection("schema-registry", dict(settings), {}, connection_policy())
    except SpecError as exc:
        raise ValueError("; ".join(f"{e.field}: {e.message}" for e in exc.errors)) from None
    problem = control_plane_service_problem(clean["url"])
    if problem:
        raise ValueError(f"settings.url: {problem}")
    return registry_client_arguments(clean, secrets)


def files_connection_root(settings: Mapping[str, Any]) -> str:
    """A stored files connection's root URI (normalised, no trailing slash), checked again
    (the policy may have changed since it was saved); raises ValueError saying what is wrong
    with its `settings.root`."""
    root = check_files_root(settings.get("root") or "", connection_policy())
    problem = control_plane_directory_problem(root)
    if problem:
        raise ValueError(problem)
    return root


def control_plane_directory_problem(root: str) -> str | None:
    """Why a root may not be used (it is, holds, or is inside a directory where the control
    plane keeps checkpoints, restore points and runs: their files could be overwritten), or
    None. Compared as canonical locations (symbolic links resolved)."""
    try:
        where = location(root)
    except LocationError:
        return None  # refused elsewhere, with its own message
    overlap = control_plane_overlap(where)
    return f"{overlap}; a pipeline may not write there" if overlap else None


def endpoint(kind: str, settings: Mapping[str, Any]) -> tuple:
    """What a connection's secrets belong to (a change of it drops them)."""
    return CONNECTION_KINDS[kind].endpoint(settings, connection_policy_lenient())


def connection_policy_lenient() -> ConnectionPolicy:
    """For reading stored settings only (never for connecting): accepts what an older, looser
    policy may have stored, so that comparing endpoints never fails."""
    return ConnectionPolicy(cert_dir="/", allow_unix_sockets=True, files_dir="/")


# -- the control plane's own services ------------------------------------------------------


def control_plane_service_problem(url: str) -> str | None:
    """Why a connection's URL may not be used (it reaches the control plane's own API, its
    database server or its broker, where a request made with the control plane's or a
    driver's standing could do harm), or None."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or {"https": 443}.get(parts.scheme, 80)
    except ValueError:
        return None  # refused elsewhere, with its own message
    for name, own in _control_plane_services():
        own_host, own_port = own
        if port == own_port and _same_server(host, own_host, port):
            return f"points at the control plane's own {name} ({own_host}:{own_port})"
    return None


def _control_plane_services() -> list[tuple[str, tuple[str, int]]]:
    from urllib.parse import urlsplit

    out = []
    for name, url, default in (
        ("API", django_settings.CONTROLPLANE_URL, 80),
        ("broker", django_settings.CELERY_BROKER_URL, 6379),
    ):
        try:
            parts = urlsplit(url)
            if parts.hostname:
                out.append((name, (parts.hostname, parts.port or default)))
        except ValueError:
            continue
    for own in _control_plane_databases():
        if not own["host"].startswith("/"):
            out.append(("database server", (own["host"], int(own["port"]))))
    return out


# -- the control plane's own database ------------------------------------------------------


def control_plane_database_problem(dsn: str) -> str | None:
    """Why a Postgres DSN may not be used (it is the control plane's own database), or None."""
    try:
        target = parse_postgres_dsn(dsn, connection_policy_lenient())
    except ValueError:
        return None  # refused elsewhere, with its own message
    for own in _control_plane_databases():
        if target["dbname"] != own["dbname"] or str(target["port"]) != str(own["port"]):
            continue
        if _same_server(target["host"], own["host"], int(target["port"])):
            return (
                f"points at the control plane's own database ({target['dbname']!r} on "
                f"{target['host']}:{target['port']}); a pipeline may not write there"
            )
    return None


def _control_plane_databases() -> list[dict[str, str]]:
    """The control plane's database as configured, and as the running process uses it (the
    test runner renames it)."""
    out = []
    for entry in (django_settings.DATABASES["default"], db_connection.settings_dict):
        out.append(
            {
                "host": entry.get("HOST") or "/var/run/postgresql",
                "port": str(entry.get("PORT") or 5432),
                "dbname": entry.get("NAME") or "",
            }
        )
    return out


def _same_server(host_a: str, host_b: str, port: int) -> bool:
    addresses_a, addresses_b = _addresses(host_a, port), _addresses(host_b, port)
    if addresses_a & addresses_b:
        return True
    # Anything on this host reaches the same server: loopback, this host's own addresses,
    # the wildcard address, and Unix sockets (of any directory: one server may have several).
    return any(map(_is_local, addresses_a)) and any(map(_is_local, addresses_b))


def _addresses(host: str, port: int) -> set[Any]:
    if host.startswith(("/", "@")):
        return {("unix", os.path.realpath(host))}
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return {("unresolved", host.lower())}
    return {ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos}


def _is_local(address: Any) -> bool:
    if isinstance(address, tuple):
        return address[0] == "unix"
    if address.is_loopback or address.is_unspecified:
        return True
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None and (mapped.is_loopback or mapped.is_unspecified):
        return True
    return address in _local_addresses()


def _local_addresses() -> set[Any]:
    import psutil

    out = set()
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                out.add(ipaddress.ip_address(entry.address.split("%")[0]))
    return out
