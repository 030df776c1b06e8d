"""The real stores checkpoints may live on, for tests: the local disk, HDFS (a NameNode and a
DataNode of Apache Hadoop) and an S3-compatible server (s3proxy), the latter two started
once per test run by `./stack test` (scripts/devstack.py), which exports their addresses;
and the Apache Cassandra node it starts beside them.

`where` gives a test a fresh, empty root on each of them; `remote` only the distributed ones;
`checkpoint_store` makes such a root the control plane's checkpoint root. `cassandra_env`,
`cassandra_session` and `cassandra_keyspace` reach Cassandra with the stack's credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from jobs.storage import Storage, StorageSettings, join, storage_for

STORES = ("local", "hdfs", "s3")


def required_env(name: str, services: str = "the services") -> str:
    """An environment variable `./stack test` sets; the test fails saying so when it is not
    (a missing service is a failed run, never a skipped test)."""
    value = os.environ.get(name, "").strip()
    if not value:
        pytest.fail(
            f"{name} is not set: run the suite through `./stack test`, which starts "
            f"{services} and exports their addresses",
            pytrace=False,
        )
    return value


def _required(name: str) -> str:
    return required_env(name, "HDFS and the S3 server")


@dataclass(frozen=True)
class CassandraEnv:
    """Where the Cassandra under test is and who to be there (CONTROLPLANE_CASSANDRA_*)."""

    hosts: str  # host:port[,host:port...]
    dc: str  # the local data centre
    user: str
    password: str

    def contact_points(self) -> list[tuple[str, int]]:
        points = []
        for host in self.hosts.split(","):
            name, _, port = host.strip().rpartition(":")
            points.append((name.strip("[]"), int(port)))
        return points


def cassandra_env() -> CassandraEnv:
    """The Cassandra `./stack test` starts (or the one CONTROLPLANE_CASSANDRA_HOSTS names); the
    test fails saying so when its variables are not set."""
    return CassandraEnv(
        hosts=required_env("CONTROLPLANE_CASSANDRA_HOSTS", "Cassandra"),
        dc=required_env("CONTROLPLANE_CASSANDRA_DC", "Cassandra"),
        user=required_env("CONTROLPLANE_CASSANDRA_USER", "Cassandra"),
        password=required_env("CONTROLPLANE_CASSANDRA_PASSWORD", "Cassandra"),
    )


@contextlib.contextmanager
def cassandra_session(
    keyspace: str | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    timeout: float = 10.0,
):
    """A cassandra-driver Session of the Cassandra under test, as the stack's user unless
    `user`/`password` say otherwise (a refused login raises NoHostAvailable, its `errors`
    AuthenticationFailed); its cluster is shut down on leaving."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy

    env = cassandra_env()
    profile = ExecutionProfile(
        load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=env.dc), request_timeout=timeout
    )
    cluster = Cluster(
        env.contact_points(),
        auth_provider=PlainTextAuthProvider(
            env.user if user is None else user, env.password if password is None else password
        ),
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=timeout,
        control_connection_timeout=timeout,
    )
    try:
        yield cluster.connect(keyspace)
    finally:
        cluster.shutdown()


@contextlib.contextmanager
def cassandra_keyspace(replication_factor: int = 1):
    """(session, name): a fresh keyspace of the test's own (one replica in the local data
    centre), the session using it; dropped on leaving."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    replication = {"class": "NetworkTopologyStrategy", cassandra_env().dc: replication_factor}
    with cassandra_session() as session:
        session.execute(f"CREATE KEYSPACE {name} WITH replication = {replication!r}")
        try:
            session.set_keyspace(name)
            yield session, name
        finally:
            session.execute(f"DROP KEYSPACE IF EXISTS {name}")


def settings_for(kind: str, timeout: float = 10.0) -> StorageSettings:
    if kind == "hdfs":
        return StorageSettings(
            hdfs_http=_required("CONTROLPLANE_HDFS_HTTP_ADDRESS"),
            hdfs_user=os.environ.get("CONTROLPLANE_HDFS_USER") or None,
            timeout=timeout,
        )
    if kind == "s3":
        return StorageSettings(
            s3_endpoint=_required("CONTROLPLANE_S3_ENDPOINT"),
            s3_access_key=_required("CONTROLPLANE_S3_ACCESS_KEY"),
            s3_secret_key=_required("CONTROLPLANE_S3_SECRET_KEY"),
            timeout=timeout,
        )
    return StorageSettings(timeout=timeout)


def base_for(kind: str, tmp_path) -> str:
    """A root of the test's own on store `kind`."""
    unique = f"tests/{uuid.uuid4().hex[:12]}"
    if kind == "hdfs":
        return join(_required("CONTROLPLANE_HDFS_URL"), unique)
    if kind == "s3":
        return f"s3a://{os.environ.get('CONTROLPLANE_S3_BUCKET') or 'controlplane'}/{unique}"
    return str(tmp_path / "store")


class Where:
    def __init__(self, kind: str, root: str, store: Storage, settings: StorageSettings):
        self.kind, self.root, self.store, self.settings = kind, root, store, settings

    def __call__(self, *parts: str) -> str:
        return join(self.root, *parts)

    def __repr__(self) -> str:
        return f"Where({self.kind}: {self.root})"


def _where(kind: str, tmp_path):
    settings = settings_for(kind)
    root = base_for(kind, tmp_path)
    store = storage_for(root, settings)
    yield Where(kind, root, store, settings)
    if kind == "hdfs":  # HDFS deletes no directory that has snapshots
        for entry in store.list(root):
            for snapshot in store.snapshots(entry.path):
                store.delete_snapshot(entry.path, snapshot)
    if kind != "local":
        store.remove_tree(root)


@pytest.fixture(params=STORES)
def where(request, tmp_path):
    """A fresh root on the local disk, on HDFS and on S3 (the test runs once on each)."""
    yield from _where(request.param, tmp_path)


@pytest.fixture(params=("hdfs", "s3"))
def remote(request, tmp_path):
    """A fresh root on HDFS and on S3."""
    yield from _where(request.param, tmp_path)


@pytest.fixture(params=STORES)
def checkpoint_store(request, settings, tmp_path):
    """The control plane's checkpoint root on the local disk, on HDFS and on S3 (the test
    runs on each), with the settings that reach it."""
    for where in _where(request.param, tmp_path):
        local = where.kind == "local"
        settings.CONTROLPLANE_CHECKPOINT_ROOT = Path(where.root) if local else where.root
        settings.CONTROLPLANE_HDFS_HTTP_ADDRESS = where.settings.hdfs_http
        settings.CONTROLPLANE_HDFS_USER = where.settings.hdfs_user
        settings.CONTROLPLANE_S3_ENDPOINT = where.settings.s3_endpoint
        settings.CONTROLPLANE_S3_ACCESS_KEY = where.settings.s3_access_key
        settings.CONTROLPLANE_S3_SECRET_KEY = where.settings.s3_secret_key
        yield where


@pytest.fixture
def silent_address():
    """A TCP server that accepts connections and never answers (a hung NameNode or store)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def fake_checkpoint(store: Storage, root: str, *, committed: int, in_flight: bool = True) -> str:
    """As tests.spark_helpers.fake_checkpoint, on any store: batches 0..committed committed
    (and one more planned), a state store of one partition (version V after batch V - 1),
    Hadoop's checksum files, a temporary file being written."""
    store.write_text(join(root, "metadata"), json.dumps({"id": "11111111-old"}) + "\n")
    store.write_text(join(root, ".metadata.crc"), "crc")
    store.write_text(join(root, "sources", "0", "0"), 'v1\n{"orders":{"0":0}}\n')
    last = committed + 1 if in_flight else committed
    for n in range(last + 1):
        offsets = {"orders": {"0": (n + 1) * 10, "1": (n + 1) * 5}}
        store.write_text(join(root, "offsets", str(n)), f"v1\n{{}}\n{json.dumps(offsets)}\n")
        store.write_text(join(root, "offsets", f".{n}.crc"), "crc")
        store.write_text(join(root, "state", "0", "0", f"{n + 1}.delta"), "rows")
        if n <= committed:
            store.write_text(join(root, "commits", str(n)), 'v1\n{"nextBatchWatermarkMs":0}\n')
    store.write_text(join(root, "offsets", f".{last + 1}.4f2a.tmp"), "half written")
    return root


def names(store: Storage, root: str) -> set[str]:
    """The files under `root`, relative to it."""
    prefix = root.rstrip("/") + "/"
    return {e.path[len(prefix) :] for e in store.walk(root)}


def registry_url() -> str:
    """The Confluent REST API of the schema registry `./stack test` starts (Apicurio Registry's
    `/apis/ccompat/v7`; or the one CONTROLPLANE_SCHEMA_REGISTRY_URL names), without a trailing
    slash; the test fails saying so when the variable is not set."""
    return required_env("CONTROLPLANE_SCHEMA_REGISTRY_URL", "the schema registry").rstrip("/")
