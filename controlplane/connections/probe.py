"""Really connecting to a connection's target: the `POST /api/connections/{name}/test/` check."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import psycopg
from kafka import KafkaConsumer

from controlplane.redaction import redact
from jobs.connections import kafka_client_config
from jobs.kafka.auth import SaslLoginError, check_sasl_login

from .models import Connection
from .policy import (
    cassandra_connection_arguments,
    files_connection_root,
    postgres_connect_arguments,
    registry_connection_arguments,
)


@dataclass
class ProbeResult:
    ok: bool
    latency_ms: float
    detail: str
    topics: list[str] | None = None
    server_version: str | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = {"ok": self.ok, "latency_ms": round(self.latency_ms, 1), "detail": self.detail}
        if self.topics is not None:
            out["topics"] = self.topics
        if self.server_version is not None:
            out["server_version"] = self.server_version
        return out


def probe(connection: Connection, timeout: float) -> ProbeResult:
    secrets = connection.get_secrets()
    started = time.monotonic()
    try:
        result = PROBES[connection.kind](connection.settings, secrets, timeout)
    except SaslLoginError as exc:  # says what was refused, without the password
        return ProbeResult(False, _ms(started), redact(str(exc), secrets.values()))
    except Exception as exc:  # any failure to reach the target is the answer, not a 500
        message = f"{type(exc).__name__}: {exc}".strip()
        return ProbeResult(False, _ms(started), redact(message, secrets.values()))
    result.latency_ms = _ms(started)
    return result


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000


def kafka_consumer(settings: dict, secrets: dict, timeout: float) -> KafkaConsumer:
    """A consumer of a stored Kafka connection for metadata, every request within `timeout`
    seconds; a refused SASL login raises SaslLoginError at once (kafka-python reports one
    only as a bootstrap timeout: it logs in first)."""
    timeout_ms = int(timeout * 1000)
    config = kafka_client_config(settings, secrets)
    check_sasl_login(config, timeout)
    return KafkaConsumer(
        **config,
        request_timeout_ms=timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
        connections_max_idle_ms=timeout_ms + 1000,
        enable_auto_commit=False,
    )


def _probe_kafka(settings: dict, secrets: dict, timeout: float) -> ProbeResult:
    consumer = kafka_consumer(settings, secrets, timeout)
    try:
        topics = sorted(consumer.topics())
    finally:
        consumer.close()
    return ProbeResult(True, 0, f"reached the cluster; {len(topics)} topic(s)", topics=topics)


def _probe_postgres(settings: dict, secrets: dict, timeout: float) -> ProbeResult:
    # Checked again here, not only on save: the policy or the control plane's database may
    # have changed since, and a test hands the stored password to the target.
    try:
        kwargs = postgres_connect_arguments(settings, secrets)
    except ValueError as exc:
        return ProbeResult(False, 0, f"refused: the DSN {exc}")
    kwargs["connect_timeout"] = max(1, round(timeout))
    with psycopg.connect(**kwargs) as conn:
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false)", (str(int(timeout * 1000)),)
        )
        (one,) = conn.execute("SELECT 1").fetchone()
        version = conn.execute("SHOW server_version").fetchone()[0]
    return ProbeResult(one == 1, 0, "SELECT 1 succeeded", server_version=version)


def _probe_files(settings: dict, secrets: dict, timeout: float) -> ProbeResult:
    """A local root: an existing directory this process may write into (the jobs may run as
    another user). Any other root is reached only by the jobs, through the cluster's Hadoop
    configuration: not probed here."""
    try:
        root = files_connection_root(settings)
    except ValueError as exc:
        return ProbeResult(False, 0, f"refused: the root {exc}")
    if not root.startswith("file://"):
        scheme = root.partition(":")[0]
        return ProbeResult(
            True,
            0,
            f"not probed from the control plane: {scheme}:// roots are reached only by the"
            " Spark jobs, with the cluster's Hadoop configuration (the root's form is valid)",
        )
    path = root.removeprefix("file://") or "/"
    if not os.path.exists(path):
        return ProbeResult(False, 0, f"{path} does not exist")
    if not os.path.isdir(path):
        return ProbeResult(False, 0, f"{path} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        return ProbeResult(False, 0, f"{path} is not writable by the control plane's user")
    return ProbeResult(True, 0, f"{path} is a writable directory")


def _probe_cassandra(settings: dict, secrets: dict, timeout: float) -> ProbeResult:
    """Log in, read the server's version and the keyspace's tables (the keyspace must exist:
    the control plane never creates one)."""
    from jobs.sinks.cassandra.connection import session

    arguments = cassandra_connection_arguments(settings, secrets)
    keyspace = arguments.pop("keyspace")
    cass = session(arguments, timeout)
    try:
        version = cass.execute("SELECT release_version FROM system.local").one()[0]
        found = cass.execute(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = %s",
            [keyspace],
        ).one()
        if found is None:
            return ProbeResult(
                False,
                0,
                f"logged in, but keyspace {keyspace!r} does not exist",
                server_version=version,
            )
        tables = [
            r.table_name
            for r in cass.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", [keyspace]
            )
        ]
    finally:
        cass.cluster.shutdown()
    return ProbeResult(
        True,
        0,
        f"logged in; keyspace {keyspace!r} has {len(tables)} table(s)",
        server_version=version,
    )


def _probe_schema_registry(settings: dict, secrets: dict, timeout: float) -> ProbeResult:
    """List the registry's subjects with the connection's credentials (through the
    connection policy: never at the control plane's own services)."""
    from jobs.registry.client import Registry

    arguments = {**registry_connection_arguments(settings, secrets), "timeout_seconds": timeout}
    with Registry(arguments) as registry:
        subjects = registry.subjects()
        level = registry.compatibility_level()
    return ProbeResult(
        True, 0, f"answered: {len(subjects)} subject(s), compatibility {level} by default"
    )


# How each kind of connection is tested (jobs.connections.CONNECTION_KINDS lists the kinds).
PROBES = {
    "kafka": _probe_kafka,
    "postgres": _probe_postgres,
    "files": _probe_files,
    "cassandra": _probe_cassandra,
    "schema-registry": _probe_schema_registry,
}
