"""Starts and stops the development stack: PostgreSQL, Redis and Apache Kafka under var/, then
the control plane itself; HDFS, an S3-compatible store (S3Proxy), Apache Cassandra and a schema
registry (Apicurio Registry) for `./stack hdfs`, `./stack s3`, `./stack cassandra`,
`./stack registry` and the tests. Called by ./stack (which has already installed packages, the
venv and the servers' jars).

Each service is reused when it is already running (started by another ./stack), started
otherwise, and stopped on exit only by the invocation that started it. Services named in the
environment (DATABASE_URL, CELERY_BROKER_URL, KAFKA_BOOTSTRAP_SERVERS, CONTROLPLANE_HDFS_URL,
CONTROLPLANE_S3_ENDPOINT, CONTROLPLANE_CASSANDRA_HOSTS, CONTROLPLANE_SCHEMA_REGISTRY_URL) are
not started at all.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import glob
import hashlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("CONTROLPLANE_VAR_DIR", ROOT / "var"))
PY = sys.executable

PG_PORT = int(os.environ.get("CONTROLPLANE_PG_PORT", "55432"))
REDIS_PORT = int(os.environ.get("CONTROLPLANE_REDIS_PORT", "56379"))
KAFKA_PORT = int(os.environ.get("CONTROLPLANE_KAFKA_PORT", "59092"))
KAFKA_CONTROLLER_PORT = int(
    os.environ.get("CONTROLPLANE_KAFKA_CONTROLLER_PORT", str(KAFKA_PORT + 1))
)
# A second client listener, SASL_PLAINTEXT, for tests of authenticated clients.
KAFKA_SASL_PORT = int(os.environ.get("CONTROLPLANE_KAFKA_SASL_PORT", str(KAFKA_PORT + 2)))
KAFKA_SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN")
# Test-only credentials of the local broker, fixed here on purpose, not generated: its
# PLAINTEXT listener on the same loopback address needs no credentials at all, so a secret
# password would protect nothing, and a fixed one is the same for every var directory, every
# restart and every storage (formatted with it, or given it at start). Never used for
# anything but this broker; `./stack services` exports them as KAFKA_SASL_USERNAME/_PASSWORD.
KAFKA_SASL_USERNAME = "cp-test"
KAFKA_SASL_PASSWORD = "cp-test-dev-only-Xq7"  # noqa: S105 - see above
# Exported by `./stack services`; with an existing cluster (KAFKA_BOOTSTRAP_SERVERS set) only
# if they are set in the environment too.
SASL_ENV = (
    "KAFKA_SASL_BOOTSTRAP_SERVERS",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SASL_MECHANISMS",
)
KAFKA_HEAP_OPTS = os.environ.get("CONTROLPLANE_KAFKA_HEAP_OPTS", "-Xms256m -Xmx512m")
WEB_HOST = os.environ.get("CONTROLPLANE_WEB_HOST", "127.0.0.1")
WEB_PORT = int(os.environ.get("CONTROLPLANE_WEB_PORT", "8000"))
PG_USER = "controlplane"
DB_NAME = "controlplane"
SINK_DB_NAME = "controlplane_sink"


def log(message: str) -> None:
    print(f"\033[1m==> {message}\033[0m", file=sys.stderr, flush=True)


class StackError(RuntimeError):
    pass


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def wait_for(what: str, check, timeout: float, logfile: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return
        time.sleep(0.2)
    hint = f"; see {logfile}" if logfile else ""
    raise StackError(f"{what} did not become ready within {timeout:.0f} s{hint}")


def pid_alive(pid: int) -> bool:
    # A child of ours that died is a zombie until reaped, and signal 0 still reaches it.
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid_alive(pid) else None


@dataclass
class Service:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    started_here: bool = False

    def running(self) -> bool:  # pragma: no cover - overridden
        raise NotImplementedError

    def stop(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def stoppable(self) -> bool:
        """Whether `./stack stop` has anything of it to stop."""
        return self.running()


# --- PostgreSQL ---------------------------------------------------------------------------


class Postgres(Service):
    """A project-local cluster. As root it runs as the `postgres` system user (PostgreSQL
    refuses to run as root); its data lives in var/postgres when that user can reach it."""

    def __init__(self) -> None:
        super().__init__("postgres")
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
        if not bins:
            raise StackError("PostgreSQL binaries not found under /usr/lib/postgresql")
        self.bin = Path(bins[-1])
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise StackError("running as root but there is no 'postgres' user") from None
        self.data = self._data_dir()
        self.logfile = VAR / "log" / "postgres.log"
        url = f"postgresql://{PG_USER}@127.0.0.1:{PG_PORT}"
        self.env = {
            "DATABASE_URL": f"{url}/{DB_NAME}",
            "CONTROLPLANE_SINK_DATABASE_URL": f"{url}/{SINK_DB_NAME}",
        }

    def _data_dir(self) -> Path:
        local = VAR / "postgres"
        if local.is_symlink():
            return local.resolve()  # placed outside the checkout by an earlier run (below)
        if self.user is None or self._reachable(VAR):
            return local
        # The checkout is somewhere the postgres user cannot enter (e.g. under /root): keep the
        # data outside it, one directory per checkout, linked from var/ so it is easy to find.
        key = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
        outside = Path("/var/lib/controlplane-dev") / key / "postgres"
        outside.parent.mkdir(parents=True, exist_ok=True)
        os.chown(outside.parent, self.user.pw_uid, self.user.pw_gid)
        if not local.exists():
            local.symlink_to(outside)
        return outside

    def _reachable(self, path: Path) -> bool:
        probe = subprocess.run(
            ["test", "-x", str(path)], user=self.user.pw_uid, check=False, capture_output=True
        )
        return probe.returncode == 0

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        kwargs = {}
        if self.user is not None:
            kwargs = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            check=check,
            capture_output=True,
            text=True,
            cwd="/",
            # Its own session: a Ctrl-C meant for ./stack must not reach the server directly.
            start_new_session=True,
            **kwargs,
        )

    def running(self) -> bool:
        return self.data.joinpath("PG_VERSION").exists() and (
            self._run("pg_ctl", "status", "-D", str(self.data), check=False).returncode == 0
        )

    def start(self) -> None:
        if self.running():
            log(f"PostgreSQL already running on port {PG_PORT}")
        else:
            if port_open(PG_PORT):
                raise StackError(
                    f"port {PG_PORT} is taken by another program: set CONTROLPLANE_PG_PORT, "
                    "or DATABASE_URL to use an existing server"
                )
            self._init()
            log(f"starting PostgreSQL on 127.0.0.1:{PG_PORT}")
            options = (
                f"-c listen_addresses=127.0.0.1 -p {PG_PORT} "
                f"-c unix_socket_directories={self.data} -c max_connections=200 "
                # A disposable development cluster: durability of the host's disk is not the
                # point, and fsync dominates test time on small machines.
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                # Two-phase commit, which Flink's exactly-once JDBC sink (XA) needs: the peer in
                # bench/throughput.py. The control plane's own sinks do not use it.
                "-c max_prepared_transactions=64"
            )
            self.logfile.parent.mkdir(parents=True, exist_ok=True)
            pg_log = self.data / "server.log"
            result = self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.data),
                "-l",
                str(pg_log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                check=False,
            )
            with contextlib.suppress(OSError):
                self.logfile.unlink(missing_ok=True)
                self.logfile.symlink_to(pg_log)
            if result.returncode != 0:
                raise StackError(f"PostgreSQL did not start: {result.stderr.strip()}; see {pg_log}")
            self.started_here = True
        self._ensure_database(DB_NAME)
        self._ensure_database(SINK_DB_NAME)

    def _init(self) -> None:
        if self.data.joinpath("PG_VERSION").exists():
            return
        log(f"initialising a PostgreSQL cluster in {self.data}")
        self.data.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            os.chown(self.data, self.user.pw_uid, self.user.pw_gid)
        os.chmod(self.data, 0o700)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            PG_USER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-locale",
        )

    def _ensure_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            f"postgresql://{PG_USER}@127.0.0.1:{PG_PORT}/postgres", autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{name}"')

    def stop(self) -> None:
        log("stopping PostgreSQL")
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", check=False)


# --- Redis -------------------------------------------------------------------------------


class Redis(Service):
    def __init__(self) -> None:
        super().__init__("redis")
        self.dir = VAR / "redis"
        self.pidfile = self.dir / "redis.pid"
        self.logfile = VAR / "log" / "redis.log"
        self.env = {"CELERY_BROKER_URL": f"redis://127.0.0.1:{REDIS_PORT}/0"}

    def running(self) -> bool:
        return read_pid(self.pidfile) is not None and port_open(REDIS_PORT)

    def start(self) -> None:
        if self.running():
            log(f"Redis already running on port {REDIS_PORT}")
            return
        if port_open(REDIS_PORT):
            raise StackError(
                f"port {REDIS_PORT} is taken by another program: set CONTROLPLANE_REDIS_PORT, "
                "or CELERY_BROKER_URL to use an existing Redis"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        log(f"starting Redis on 127.0.0.1:{REDIS_PORT}")
        subprocess.run(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(REDIS_PORT),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--daemonize",
                "yes",
                "--pidfile",
                str(self.pidfile),
                "--logfile",
                str(self.logfile),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            check=True,
        )
        wait_for("Redis", lambda: port_open(REDIS_PORT), 20, self.logfile)
        self.started_here = True

    def stop(self) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            log("stopping Redis")
            terminate(pid)


# --- Apache Kafka -------------------------------------------------------------------------


class Kafka(Service):
    """One Apache Kafka broker in KRaft mode (broker and controller in one process), its jars
    copied from Maven Central by ./stack into var/kafka/libs (scripts/kafka/pom.xml pins
    them). Its log lives on disk in var/kafka/data and survives restarts; the storage is
    formatted once, when that directory is new."""

    def __init__(self) -> None:
        super().__init__("kafka")
        self.dir = VAR / "kafka"
        self.libs = self.dir / "libs"
        self.data = self.dir / "data"
        self.config = self.dir / "server.properties"
        self.log_config = self.dir / "log4j2.properties"
        self.pidfile = self.dir / "kafka.pid"
        self.logfile = VAR / "log" / "kafka.log"
        # The JVM's own output (start-up failures, crashes); the broker logs to kafka.log.
        self.outfile = VAR / "log" / "kafka.out"
        self.formatted_here = False
        self.env = {
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{KAFKA_PORT}",
            # The SASL listener and its test user (tests/test_kafka_sasl.py).
            "KAFKA_SASL_BOOTSTRAP_SERVERS": f"127.0.0.1:{KAFKA_SASL_PORT}",
            "KAFKA_SASL_USERNAME": KAFKA_SASL_USERNAME,
            "KAFKA_SASL_PASSWORD": KAFKA_SASL_PASSWORD,
            "KAFKA_SASL_MECHANISMS": ",".join(KAFKA_SASL_MECHANISMS),
        }

    def running(self) -> bool:
        return read_pid(self.pidfile) is not None and port_open(KAFKA_PORT)

    def start(self) -> None:
        if self.running():
            log(f"Kafka already running on port {KAFKA_PORT}")
            if not port_open(KAFKA_SASL_PORT):
                # Started by an older ./stack, before the broker had a SASL listener: the
                # SASL tests are skipped until it is restarted.
                log(
                    f"Kafka has no SASL listener on port {KAFKA_SASL_PORT} (started before it "
                    "had one): `./stack stop`, then start it again, to get it"
                )
                for key in SASL_ENV:
                    self.env.pop(key, None)
            return
        for port, variable in (
            (KAFKA_PORT, "CONTROLPLANE_KAFKA_PORT"),
            (KAFKA_CONTROLLER_PORT, "CONTROLPLANE_KAFKA_CONTROLLER_PORT"),
            (KAFKA_SASL_PORT, "CONTROLPLANE_KAFKA_SASL_PORT"),
        ):
            if port_open(port):
                raise StackError(
                    f"port {port} is taken by another program: set {variable}, "
                    "or KAFKA_BOOTSTRAP_SERVERS to use an existing cluster"
                )
        if not self.libs.joinpath(".installed").exists():
            raise StackError(f"Kafka's jars are not in {self.libs}: run ./stack, which copies them")
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._format()
        log(
            f"starting Kafka on 127.0.0.1:{KAFKA_PORT} (SASL on {KAFKA_SASL_PORT}, "
            f"controller on {KAFKA_CONTROLLER_PORT})"
        )
        with open(self.outfile, "ab") as out:
            proc = subprocess.Popen(
                [*self._java(), "kafka.Kafka", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                start_new_session=True,  # Ctrl-C is ours to handle, in order
            )
        self.pidfile.write_text(str(proc.pid))
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise StackError(
                    f"Kafka exited with code {proc.returncode} while starting; "
                    f"see {self.logfile} and {self.outfile}"
                )
            with contextlib.suppress(Exception):
                # The admin client only once the listener is open: made earlier, its bootstrap
                # backs off exponentially and can sleep ~20 s past the broker's start (seen
                # with HDFS and S3Proxy starting beside it in ./stack test).
                if port_open(KAFKA_PORT) and self._answers() and port_open(KAFKA_SASL_PORT):
                    break
            if time.monotonic() > deadline:
                terminate(proc.pid)
                raise StackError(f"Kafka did not become ready within 120 s; see {self.logfile}")
            time.sleep(0.5)
        self.started_here = True
        self._ensure_sasl_users()

    def _java(self) -> list[str]:
        return [
            shutil.which("java") or "java",
            *KAFKA_HEAP_OPTS.split(),
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log_config}",
            # Logging stays up until the broker's own shutdown hook has finished logging.
            "-Dlog4j2.shutdownHookEnabled=false",
            "-cp",
            f"{self.libs}/*",
        ]

    def _write_config(self) -> None:
        """Written on every start, so port changes take effect (the quorum's one voter is
        named here, not in the formatted storage)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        plain = f"127.0.0.1:{KAFKA_PORT}"
        sasl = f"127.0.0.1:{KAFKA_SASL_PORT}"
        controller = f"127.0.0.1:{KAFKA_CONTROLLER_PORT}"
        scram_module = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{controller}",
            "listeners": f"PLAINTEXT://{plain},SASL_PLAINTEXT://{sasl},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{plain},SASL_PLAINTEXT://{sasl}",
            "controller.listener.names": "CONTROLLER",
            # Brokers (one here) and the controller talk over PLAINTEXT, without SASL.
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            # The SASL listener, for tests of authenticated clients: SCRAM users live in the
            # cluster metadata (added at format time, or by _ensure_sasl_users), PLAIN users
            # in the listener's JAAS config. No authorizer: an authenticated user may do
            # anything, as may any client of the PLAINTEXT listener.
            "sasl.enabled.mechanisms": ",".join(KAFKA_SASL_MECHANISMS),
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": scram_module,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram_module,
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{KAFKA_SASL_USERNAME}="{KAFKA_SASL_PASSWORD}";'
            ),
            "log.dirs": str(self.data),
            # One broker: every internal topic has one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            "default.replication.factor": "1",
            "num.partitions": "3",
            # Topics are created deliberately (the load generator and tests create theirs), as
            # on most real clusters: a lookup of a missing topic must not create it.
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            # Retention like a real cluster's, bounded for a development disk: a week, and at
            # most 512 MiB per partition, in 64 MiB segments.
            "log.retention.hours": "168",
            "log.retention.bytes": str(512 * 1024 * 1024),
            "log.segment.bytes": str(64 * 1024 * 1024),
            # Kafka's default is 5 minutes; the data-loss tests wait for retention to act.
            "log.retention.check.interval.ms": "10000",
            "group.initial.rebalance.delay.ms": "0",
        }
        self.config.write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            + "".join(f"{k}={v}\n" for k, v in settings.items())
        )
        self.config.chmod(0o600)  # it names the (test-only) PLAIN password
        self.log_config.write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            "status = warn\n"
            "appender.file.type = RollingFile\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self.logfile}\n"
            f"appender.file.filePattern = {self.logfile}.%i\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "appender.file.policies.type = Policies\n"
            "appender.file.policies.size.type = SizeBasedTriggeringPolicy\n"
            "appender.file.policies.size.size = 20MB\n"
            "appender.file.strategy.type = DefaultRolloverStrategy\n"
            "appender.file.strategy.max = 2\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
        )

    def _format(self) -> None:
        """Format the KRaft storage once: a new cluster id for a new data directory."""
        if self.data.joinpath("meta.properties").exists():
            return
        log(f"formatting Kafka storage in {self.data}")
        # Kafka's own form of a cluster id (urlsafe base64 of 16 bytes); never one starting with
        # "-", which the tool's argument parser would take for an option (1 run in 64 failed).
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run(
            [
                *self._java(),
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                cluster_id,
                "--config",
                str(self.config),
                *(
                    arg
                    for mechanism in KAFKA_SASL_MECHANISMS
                    if mechanism.startswith("SCRAM")
                    for arg in (
                        "--add-scram",
                        f"{mechanism}=[name={KAFKA_SASL_USERNAME},password={KAFKA_SASL_PASSWORD}]",
                    )
                ),
            ],
            cwd=self.dir,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise StackError(
                f"formatting Kafka storage failed: {(result.stderr or result.stdout).strip()}"
            )
        self.formatted_here = True

    @staticmethod
    def _ensure_sasl_users() -> None:
        """The SCRAM credentials of the test user, set through the PLAINTEXT listener each
        time the broker is started here: storage formatted before the SASL listener existed
        has no users (and storage formatted with another password has stale ones); setting
        them again (same password, new salt) is harmless, and one request."""
        from kafka.admin import KafkaAdminClient, UserScramCredentialUpsertion

        admin = KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{KAFKA_PORT}", request_timeout_ms=10000
        )
        try:
            for mechanism in KAFKA_SASL_MECHANISMS:
                if not mechanism.startswith("SCRAM"):
                    continue
                # One request per mechanism: the broker refuses a user twice in one.
                error = admin.alter_user_scram_credentials(
                    [
                        UserScramCredentialUpsertion(
                            KAFKA_SASL_USERNAME, mechanism, KAFKA_SASL_PASSWORD
                        )
                    ]
                ).get(KAFKA_SASL_USERNAME)
                if error:
                    raise StackError(f"could not set Kafka's {mechanism} test user: {error}")
        finally:
            admin.close()

    @staticmethod
    def _answers() -> bool:
        from kafka.admin import KafkaAdminClient

        admin = KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{KAFKA_PORT}", request_timeout_ms=5000
        )
        try:
            admin.list_topics()
        finally:
            admin.close()
        return True

    def stop(self) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            log("stopping Kafka")
            # A controlled shutdown flushes and closes the logs: no recovery on the next start.
            terminate(pid, timeout=60)


# --- Spark standalone cluster (optional: ./stack cluster) -------------------------------


SPARK_MASTER_PORT = int(os.environ.get("CONTROLPLANE_SPARK_MASTER_PORT", "57077"))
SPARK_MASTER_UI_PORT = int(os.environ.get("CONTROLPLANE_SPARK_MASTER_UI_PORT", "58080"))


def spark_home() -> Path:
    """pip's pyspark is a Spark distribution's jars and scripts (without sbin/)."""
    import importlib.util

    found = importlib.util.find_spec("pyspark")
    if found is None or not found.origin:
        raise StackError("pyspark is not installed in the project's venv: run ./stack")
    return Path(found.origin).parent


class SparkCluster(Service):
    """A Spark standalone master and `workers` workers on loopback, started from pip's jars
    with `spark-class` (pip ships no sbin/start-master.sh). Each worker offers `cores` cores
    and `memory` to executors and keeps their work directories (logs, fetched files) in
    var/spark/worker-N. Starting it again starts only what is not running, so a worker
    that died comes back."""

    def __init__(
        self,
        workers: int = 2,
        *,
        var: Path | None = None,
        port: int = SPARK_MASTER_PORT,
        ui_port: int = SPARK_MASTER_UI_PORT,
        cores: int = 2,
        memory: str = "2g",
    ) -> None:
        super().__init__("spark")
        self.dir = (var or VAR) / "spark"
        self.logs = (var or VAR) / "log"
        self.workers = workers
        self.port, self.ui_port = port, ui_port
        self.cores, self.memory = cores, memory
        self.url = f"spark://127.0.0.1:{port}"
        self.ui_url = f"http://127.0.0.1:{ui_port}"
        self.env = {"SPARK_MASTER": self.url, "SPARK_MASTER_UI_URL": self.ui_url}

    def _pidfile(self, role: str) -> Path:
        return self.dir / f"{role}.pid"

    def pid(self, role: str) -> int | None:
        """The pid of `master` or `worker-N`, if it runs."""
        return read_pid(self._pidfile(role))

    def running(self) -> bool:
        return self.pid("master") is not None and port_open(self.port)

    def status(self) -> dict:
        """The master's view (its UI's JSON): workers, applications."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:  # noqa: S310
            return json.load(answer)

    def alive_workers(self) -> int:
        try:
            return int(self.status().get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def _spawn(self, role: str, main_class: str, *args: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": PY,
        }
        with open(self.logs / f"spark-{role}.log", "ab") as out:
            proc = subprocess.Popen(
                [str(home / "bin" / "spark-class"), main_class, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                env=env,
                start_new_session=True,
            )
        self._pidfile(role).write_text(str(proc.pid))
        self.started_here = True

    def start(self) -> None:
        if not self.running():
            for port, variable in (
                (self.port, "CONTROLPLANE_SPARK_MASTER_PORT"),
                (self.ui_port, "CONTROLPLANE_SPARK_MASTER_UI_PORT"),
            ):
                if port_open(port):
                    raise StackError(f"port {port} is taken by another program: set {variable}")
            log(f"starting a Spark standalone master on {self.url} (UI {self.ui_url})")
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(self.port),
                "--webui-port", str(self.ui_port),
            )  # fmt: skip
            wait_for(
                "the Spark master",
                lambda: port_open(self.port) and port_open(self.ui_port),
                60,
                self.logs / "spark-master.log",
            )
        for n in range(1, self.workers + 1):
            role = f"worker-{n}"
            if self.pid(role) is not None:
                continue
            work = self.dir / role
            work.mkdir(parents=True, exist_ok=True)
            log(f"starting Spark {role} ({self.cores} cores, {self.memory})")
            self._spawn(
                role,
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1",
                "--cores", str(self.cores),
                "--memory", self.memory,
                "--work-dir", str(work),
                "--webui-port", "0",
                self.url,
            )  # fmt: skip
        wait_for(
            f"{self.workers} Spark workers registered with the master",
            lambda: self.alive_workers() >= self.workers,
            90,
            self.logs / "spark-worker-1.log",
        )

    def stop(self) -> None:
        roles = [f"worker-{n}" for n in range(1, self.workers + 1)] + ["master"]
        for role in roles:
            pid = self.pid(role)
            if pid:
                log(f"stopping Spark {role}")
                terminate(pid, timeout=20)


def terminate(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# --- HDFS (optional: ./stack hdfs; started by ./stack test) -------------------------------


HDFS_NAMENODE_PORT = int(os.environ.get("CONTROLPLANE_HDFS_NAMENODE_PORT", "58020"))
HDFS_NAMENODE_HTTP_PORT = int(os.environ.get("CONTROLPLANE_HDFS_NAMENODE_HTTP_PORT", "58870"))
HDFS_DATANODE_PORT = int(os.environ.get("CONTROLPLANE_HDFS_DATANODE_PORT", "58866"))
HDFS_DATANODE_HTTP_PORT = int(os.environ.get("CONTROLPLANE_HDFS_DATANODE_HTTP_PORT", "58864"))
HDFS_DATANODE_IPC_PORT = int(os.environ.get("CONTROLPLANE_HDFS_DATANODE_IPC_PORT", "58867"))
HDFS_HEAP_OPTS = os.environ.get("CONTROLPLANE_HDFS_HEAP_OPTS", "-Xmx256m")
# The directory the control plane and the tests work in, owned by the OS user (below).
HDFS_HOME_DIR = "/controlplane"

# An empty web application: Hadoop's HTTP servers look up webapps/<name> on the classpath, and
# the jars on Maven Central ship none (the JMX servlet and WebHDFS are added in code, so an
# empty one is all they need).
EMPTY_WEB_XML = """<?xml version="1.0" encoding="UTF-8"?>
<web-app xmlns="http://xmlns.jcp.org/xml/ns/javaee" version="3.1"/>
"""


def os_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def http_json(url: str, method: str = "GET", timeout: float = 3.0) -> dict:
    import json
    import urllib.request

    request = urllib.request.Request(url, method=method)  # noqa: S310 - loopback, ours
    with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310
        return json.load(answer)


def spawn_detached(command: list[str], outfile: Path, pidfile: Path, cwd: Path) -> subprocess.Popen:
    """A server in its own session (a Ctrl-C meant for ./stack must not reach it directly),
    its output appended to `outfile`, its own pid (not a shell's) in `pidfile`."""
    outfile.parent.mkdir(parents=True, exist_ok=True)
    with open(outfile, "ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
    pidfile.write_text(str(proc.pid))
    return proc


def wait_started(
    what: str,
    proc: subprocess.Popen,
    check,
    timeout: float,
    logs: str,
    since: float | None = None,
) -> float:
    """Wait until `check()` holds; fail at once if the process exits. The seconds it took
    (counted from `since`, a time.monotonic() of the launch, if given)."""
    started = time.monotonic() if since is None else since
    while True:
        if proc.poll() is not None:
            raise StackError(
                f"{what} exited with code {proc.returncode} while starting; see {logs}"
            )
        with contextlib.suppress(Exception):
            if check():
                return time.monotonic() - started
        if time.monotonic() - started > timeout:
            terminate(proc.pid, timeout=20)
            raise StackError(f"{what} did not become ready within {timeout:.0f} s; see {logs}")
        time.sleep(0.2)


class Hdfs(Service):
    """One HDFS NameNode and one DataNode of Apache Hadoop (the version of the Hadoop client in
    pip's pyspark), each its own JVM, from Maven Central's jars copied by ./stack into
    var/hadoop/libs (scripts/hadoop/pom.xml pins them). On loopback only, every port its own
    (none of Hadoop's defaults), WebHDFS on, one replica. The namespace (var/hdfs/name) is
    formatted once and, with the blocks (var/hdfs/data), kept across restarts.

    Permission checks stay on, as on a real cluster. Simple authentication: a client is whoever
    it says it is, and the OS user that starts the NameNode is HDFS's superuser, so the stack's
    own clients (the same OS user) may use `/`; the start creates /controlplane owned by that
    user for the control plane and the tests, and a client naming another user gets the
    permission errors a real cluster gives.

    Fault tests stop and start either process (`stop_datanode()`, `start_namenode()`...); the
    NameNode notices a stopped DataNode within ~12 s (1 s heartbeats, 1 s recheck: 2 x recheck
    + 10 x heartbeat), not Hadoop's default 10.5 minutes."""

    ROLES = ("namenode", "datanode")
    MAIN_CLASSES = {
        "namenode": "org.apache.hadoop.hdfs.server.namenode.NameNode",
        "datanode": "org.apache.hadoop.hdfs.server.datanode.DataNode",
    }

    def __init__(
        self,
        *,
        var: Path | None = None,
        libs: Path | None = None,
        namenode_port: int = HDFS_NAMENODE_PORT,
        namenode_http_port: int = HDFS_NAMENODE_HTTP_PORT,
        datanode_port: int = HDFS_DATANODE_PORT,
        datanode_http_port: int = HDFS_DATANODE_HTTP_PORT,
        datanode_ipc_port: int = HDFS_DATANODE_IPC_PORT,
        heap_opts: str = HDFS_HEAP_OPTS,
    ) -> None:
        super().__init__("hdfs")
        var = var or VAR
        self.dir = var / "hdfs"
        self.conf = self.dir / "conf"
        self.webroot = self.dir / "webroot"
        self.name_dir = self.dir / "name"
        self.data_dir = self.dir / "data"
        self.logs = var / "log"
        # The jars are the checkout's (./stack copies them there), whatever `var` a test uses.
        self.libs = libs or VAR / "hadoop" / "libs"
        self.heap_opts = heap_opts
        self.ports = {
            "namenode": {
                "CONTROLPLANE_HDFS_NAMENODE_PORT": namenode_port,
                "CONTROLPLANE_HDFS_NAMENODE_HTTP_PORT": namenode_http_port,
            },
            "datanode": {
                "CONTROLPLANE_HDFS_DATANODE_PORT": datanode_port,
                "CONTROLPLANE_HDFS_DATANODE_HTTP_PORT": datanode_http_port,
                "CONTROLPLANE_HDFS_DATANODE_IPC_PORT": datanode_ipc_port,
            },
        }
        self.namenode_port, self.namenode_http_port = namenode_port, namenode_http_port
        self.datanode_http_port = datanode_http_port
        self.user = os_user()
        self.url = f"hdfs://127.0.0.1:{namenode_port}"
        self.http_address = f"127.0.0.1:{namenode_http_port}"
        self.formatted_here = False
        # Seconds each start of this object took, for the record (start(), start_namenode()...).
        self.timings: dict[str, float] = {}
        self.env = {
            "CONTROLPLANE_HDFS_URL": self.url,
            "CONTROLPLANE_HDFS_HTTP_ADDRESS": self.http_address,
            "CONTROLPLANE_HDFS_USER": self.user,
        }

    # -- state ----------------------------------------------------------------------------

    def pidfile(self, role: str) -> Path:
        return self.dir / f"{role}.pid"

    def pid(self, role: str) -> int | None:
        """The pid of `namenode` or `datanode`, if it runs."""
        return read_pid(self.pidfile(role))

    def running(self) -> bool:
        return all(self.pid(role) for role in self.ROLES) and port_open(self.namenode_port)

    def stoppable(self) -> bool:
        return any(self.pid(role) for role in self.ROLES)

    def namenode_state(self) -> dict:
        """The NameNode's FSNamesystemState bean: NumLiveDataNodes, NumDeadDataNodes, FSState
        (`Operational` or `safeMode`), CapacityRemaining..."""
        query = "Hadoop:service=NameNode,name=FSNamesystemState"
        url = f"http://{self.http_address}/jmx?qry={query}"
        return http_json(url)["beans"][0]

    def ready(self) -> bool:
        """Both up: a live DataNode and out of safe mode, so reads and writes work."""
        state = self.namenode_state()
        return state["NumLiveDataNodes"] >= 1 and state["FSState"] == "Operational"

    def datanode_registered(self) -> bool:
        """The DataNode's own view: registered with the NameNode and heart-beating. (The
        NameNode's count of live DataNodes lags: a DataNode stopped a moment ago still
        counts.)"""
        import json

        actors = json.loads(self._datanode_info()["BPServiceActorInfo"])
        return bool(actors) and all(actor.get("ActorState") == "RUNNING" for actor in actors)

    def _datanode_info(self) -> dict:
        # Only this attribute: reading the whole bean before the DataNode has registered
        # logs a stack trace per request.
        query = "Hadoop:service=DataNode,name=DataNodeInfo::BPServiceActorInfo"
        url = f"http://127.0.0.1:{self.datanode_http_port}/jmx?get={query}"
        return http_json(url)["beans"][0]

    # -- life cycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self.running() and self._answers(self.ready):
            log(f"HDFS already running ({self.url}, WebHDFS on {self.http_address})")
            return
        started = time.monotonic()
        # Both JVMs start at once (the DataNode retries until the NameNode answers): on two
        # cores that saves most of the DataNode's own start-up time.
        roles = [role for role in self.ROLES if self.pid(role) is None]
        self._prepare(roles)
        launched = [(role, *self._launch(role)) for role in roles]
        for role, proc, since in launched:
            self._await(role, proc, since)
        wait_for("HDFS (a live DataNode, out of safe mode)", self.ready, 120, self._logs_hint())
        self._ensure_home_dir()
        self.timings["start"] = time.monotonic() - started
        seconds = self.timings["start"]
        log(f"HDFS ready in {seconds:.1f} s: {self.url}, WebHDFS on {self.http_address}")

    def start_namenode(self) -> None:
        """Start the NameNode unless it runs; wait until it answers (and, if the DataNode
        runs, until it has left safe mode with the DataNode live)."""
        if self.pid("namenode") is None:
            self._prepare(["namenode"])
            self._await("namenode", *self._launch("namenode"))
        if self.pid("datanode") is not None:
            wait_for("the HDFS NameNode leaving safe mode", self.ready, 120, self._logs_hint())

    def start_datanode(self) -> None:
        """Start the DataNode unless it runs; wait until it has registered (and, if the
        NameNode runs, until the NameNode has it live and has left safe mode)."""
        if self.pid("datanode") is None:
            self._prepare(["datanode"])
            self._await("datanode", *self._launch("datanode"))
        if self.pid("namenode") is not None:
            wait_for("HDFS (a live DataNode, out of safe mode)", self.ready, 120, self._logs_hint())

    def stop_namenode(self) -> None:
        self._stop_role("namenode")

    def stop_datanode(self) -> None:
        self._stop_role("datanode")

    def stop(self) -> None:
        self._stop_role("datanode")
        self._stop_role("namenode")

    def _stop_role(self, role: str) -> None:
        pid = self.pid(role)
        if pid:
            log(f"stopping the HDFS {role}")
            terminate(pid, timeout=30)

    def _prepare(self, roles: list[str]) -> None:
        """Before starting `roles`: their ports free, the jars there, the configuration
        written, the namespace formatted (before any DataNode starts: formatting empties its
        directory)."""
        for role in roles:
            for variable, port in self.ports[role].items():
                if port_open(port):
                    raise StackError(
                        f"port {port} is taken by another program: set {variable}, or "
                        "CONTROLPLANE_HDFS_URL (and CONTROLPLANE_HDFS_HTTP_ADDRESS) to use an "
                        "existing HDFS"
                    )
        if not self.libs.joinpath(".installed").exists():
            raise StackError(
                f"Hadoop's jars are not in {self.libs}: run ./stack, which copies them"
            )
        self._write_config()
        if "namenode" in roles:
            self._format()

    def _launch(self, role: str) -> tuple[subprocess.Popen, float]:
        _, outfile = self._logfiles(role)
        log(f"starting the HDFS {role}")
        proc = spawn_detached(
            [*self._java(role), self.MAIN_CLASSES[role]], outfile, self.pidfile(role), self.dir
        )
        self.started_here = True
        return proc, time.monotonic()

    def _await(self, role: str, proc: subprocess.Popen, since: float) -> None:
        """Wait until `role` answers (a DataNode: has registered, if a NameNode runs)."""
        logfile, outfile = self._logfiles(role)
        if role == "namenode":
            check = lambda: port_open(self.namenode_port) and bool(self.namenode_state())  # noqa: E731
        elif self.pid("namenode") is not None:
            check = self.datanode_registered
        else:  # nothing to register with: up is all it can be
            check = lambda: bool(self._datanode_info())  # noqa: E731
        logs = f"{logfile} and {outfile}"
        seconds = wait_started(f"the HDFS {role}", proc, check, 120, logs, since=since)
        self.timings[role] = seconds
        log(f"the HDFS {role} is up in {seconds:.1f} s")

    def _logfiles(self, role: str) -> tuple[Path, Path]:
        # The daemon logs to .log (log4j); the JVM's own output (start-up failures, crashes)
        # goes to .out.
        return self.logs / f"hdfs-{role}.log", self.logs / f"hdfs-{role}.out"

    def _logs_hint(self) -> Path:
        return self.logs / "hdfs-namenode.log"

    @staticmethod
    def _answers(check) -> bool:
        try:
            return bool(check())
        except (OSError, ValueError, KeyError, IndexError):
            return False

    def _java(self, role: str) -> list[str]:
        logfile, _ = self._logfiles(role)
        return [
            shutil.which("java") or "java",
            *self.heap_opts.split(),
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.net.preferIPv4Stack=true",
            f"-Dhadoop.home.dir={self.dir}",
            f"-Dhadoop.log.dir={self.logs}",
            f"-Dhdfs.log.file={logfile}",
            f"-Dproc_{role}",  # how Hadoop's scripts mark the process (ps, jps)
            "-cp",
            # conf/ first: core-site.xml, hdfs-site.xml and log4j.properties are found there.
            f"{self.conf}:{self.webroot}:{self.libs}/*",
        ]

    def _write_config(self) -> None:
        """Written on every start, so port changes take effect."""
        self.conf.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for app in ("hdfs", "datanode", "secondary"):
            web_xml = self.webroot / "webapps" / app / "WEB-INF" / "web.xml"
            web_xml.parent.mkdir(parents=True, exist_ok=True)
            web_xml.write_text(EMPTY_WEB_XML)
        (nn_rpc, nn_http), (dn, dn_http, dn_ipc) = (
            self.ports["namenode"].values(),
            self.ports["datanode"].values(),
        )
        core = {
            "fs.defaultFS": self.url,
            "hadoop.tmp.dir": str(self.dir / "tmp"),
            "hadoop.security.authentication": "simple",
            # The web UI's user when a request names none.
            "hadoop.http.staticuser.user": self.user,
        }
        hdfs = {
            "dfs.namenode.name.dir": str(self.name_dir),
            "dfs.datanode.data.dir": str(self.data_dir),
            "dfs.replication": "1",
            "dfs.webhdfs.enabled": "true",
            "dfs.permissions.enabled": "true",
            "dfs.http.policy": "HTTP_ONLY",
            # Every address on loopback, every port our own. The HTTPS, secondary and backup
            # addresses are never opened here (HTTP_ONLY, no such daemons): port 0 anyway, so
            # no default port is ever named.
            "dfs.namenode.rpc-address": f"127.0.0.1:{nn_rpc}",
            "dfs.namenode.http-address": f"127.0.0.1:{nn_http}",
            "dfs.namenode.https-address": "127.0.0.1:0",
            "dfs.namenode.secondary.http-address": "127.0.0.1:0",
            "dfs.namenode.secondary.https-address": "127.0.0.1:0",
            "dfs.namenode.backup.address": "127.0.0.1:0",
            "dfs.namenode.backup.http-address": "127.0.0.1:0",
            "dfs.datanode.address": f"127.0.0.1:{dn}",
            "dfs.datanode.http.address": f"127.0.0.1:{dn_http}",
            "dfs.datanode.ipc.address": f"127.0.0.1:{dn_ipc}",
            "dfs.datanode.https.address": "127.0.0.1:0",
            # The DataNode's name is its loopback address: WebHDFS redirects and clients'
            # block transfers go there, never to the machine's name (which resolves to an
            # address off loopback here).
            "dfs.datanode.hostname": "127.0.0.1",
            "dfs.client.use.datanode.hostname": "true",
            "dfs.datanode.use.datanode.hostname": "true",
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            # Out of safe mode as soon as the blocks are reported, not 30 s later.
            "dfs.namenode.safemode.extension": "0",
            # A stopped DataNode is dead after 2 x recheck + 10 x heartbeat = 12 s (Hadoop's
            # default: 10.5 minutes): the fault tests stop it.
            "dfs.heartbeat.interval": "1",
            "dfs.namenode.heartbeat.recheck-interval": "1000",
            # Stale (read last, if clients ask) after 5 s; Hadoop warns when it exceeds the 12 s.
            "dfs.namenode.stale.datanode.interval": "5000",
            # One DataNode: a write pipeline that loses it has no other to take its place.
            "dfs.client.block.write.replace-datanode-on-failure.enable": "false",
            # A file is closed once its last block is committed by the writer, without waiting
            # for the DataNode's report that it is stored (Hadoop waits, polling from 400 ms):
            # a checkpoint writes a few small files per batch (the per-batch cost measured by
            # bench/storage.py), and WebHDFS writes through a DataNode's own client.
            "dfs.namenode.file.close.num-committed-allowed": "1",
            "dfs.client.block.write.locateFollowingBlock.initial.delay.ms": "20",
        }
        for name, settings in (("core-site.xml", core), ("hdfs-site.xml", hdfs)):
            (self.conf / name).write_text(
                '<?xml version="1.0"?>\n'
                "<!-- Written by scripts/devstack.py on every start; edits are lost. -->\n"
                "<configuration>\n"
                + "".join(
                    f"  <property><name>{k}</name><value>{v}</value></property>\n"
                    for k, v in settings.items()
                )
                + "</configuration>\n"
            )
        (self.conf / "log4j.properties").write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            "log4j.rootLogger=INFO, RFA\n"
            "log4j.appender.RFA=org.apache.log4j.RollingFileAppender\n"
            "log4j.appender.RFA.File=${hdfs.log.file}\n"
            "log4j.appender.RFA.MaxFileSize=20MB\n"
            "log4j.appender.RFA.MaxBackupIndex=2\n"
            "log4j.appender.RFA.layout=org.apache.log4j.PatternLayout\n"
            "log4j.appender.RFA.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n\n"
            # A line per operation or block otherwise (set to INFO to see them).
            "log4j.logger.org.apache.hadoop.hdfs.server.namenode.FSNamesystem.audit=WARN\n"
            "log4j.logger.org.apache.hadoop.hdfs.StateChange=WARN\n"
            "log4j.logger.org.apache.hadoop.hdfs.server.datanode.DataNode.clienttrace=WARN\n"
            "log4j.logger.http.requests=WARN\n"
            # Hadoop 3.5 logs a line per block-pool subdirectory lock (1,024) at each start.
            "log4j.logger.org.apache.hadoop.hdfs.server.datanode.fsdataset.impl.FsDatasetImpl=WARN\n"
            "log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR\n"
        )

    def _format(self) -> None:
        """Format the namespace once. Blocks of an earlier namespace would make the DataNode
        refuse to start (another cluster id): they go with it."""
        if self.name_dir.joinpath("current", "VERSION").exists():
            return
        log(f"formatting the HDFS namespace in {self.name_dir}")
        shutil.rmtree(self.data_dir, ignore_errors=True)
        _, outfile = self._logfiles("namenode")
        result = subprocess.run(
            [
                *self._java("namenode"),
                self.MAIN_CLASSES["namenode"],
                "-format",
                "-nonInteractive",
                "-force",
            ],
            cwd=self.dir,
            capture_output=True,
            text=True,
            check=False,
        )
        with open(outfile, "a") as out:
            out.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise StackError(f"formatting HDFS failed (exit {result.returncode}); see {outfile}")
        self.formatted_here = True

    def _ensure_home_dir(self) -> None:
        """/controlplane, owned by the OS user (MKDIRS through WebHDFS as that user: a no-op
        when it exists)."""
        url = (
            f"http://{self.http_address}/webhdfs/v1{HDFS_HOME_DIR}"
            f"?op=MKDIRS&permission=755&user.name={self.user}"
        )
        if not http_json(url, method="PUT").get("boolean"):
            raise StackError(f"could not create {HDFS_HOME_DIR} in HDFS")


# --- S3-compatible object store (optional: ./stack s3; started by ./stack test) -----------


S3_PORT = int(os.environ.get("CONTROLPLANE_S3_PORT", "58333"))
S3_BUCKET = "controlplane"
S3_HEAP_OPTS = os.environ.get("CONTROLPLANE_S3_HEAP_OPTS", "-Xmx512m")


class S3Proxy(Service):
    """S3Proxy (org.gaul:s3proxy) serving the S3 API from its filesystem backend, objects under
    var/s3/data, on loopback, from Maven Central's jars copied by ./stack into
    var/s3proxy/libs (scripts/s3proxy/pom.xml pins them). A real server speaking the protocol
    (AWS signatures V2 and V4, multipart uploads, server-side copies...), not a mock.

    Requests must be signed with the stack's one key pair, made at random on first start and
    kept in var/s3/credentials (mode 0600): a development store, but one other programs on the
    machine cannot write to by accident. The start creates the bucket `controlplane`."""

    def __init__(
        self,
        *,
        var: Path | None = None,
        libs: Path | None = None,
        port: int = S3_PORT,
        bucket: str = S3_BUCKET,
        heap_opts: str = S3_HEAP_OPTS,
    ) -> None:
        super().__init__("s3")
        var = var or VAR
        self.dir = var / "s3"
        self.data = self.dir / "data"
        self.credentials_file = self.dir / "credentials"
        self.config = self.dir / "s3proxy.properties"
        self.log_config = self.dir / "logback.xml"
        self.pidfile = self.dir / "s3proxy.pid"
        self.logfile = var / "log" / "s3proxy.log"
        # The JVM's own output (start-up failures, crashes); S3Proxy logs to s3proxy.log.
        self.outfile = var / "log" / "s3proxy.out"
        self.libs = libs or VAR / "s3proxy" / "libs"
        self.port = port
        self.bucket = bucket
        self.heap_opts = heap_opts
        self.endpoint = f"http://127.0.0.1:{port}"
        self.timings: dict[str, float] = {}

    def credentials(self) -> tuple[str, str]:
        """(access key, secret key): made once, at random, then read from the file."""
        import json
        import secrets

        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            stored = json.loads(self.credentials_file.read_text())
            return stored["access_key"], stored["secret_key"]
        access_key = "CP" + secrets.token_hex(9).upper()  # 20 characters, like AWS's
        secret_key = secrets.token_urlsafe(30)  # 40 characters, none special in .properties
        self.dir.mkdir(parents=True, exist_ok=True)
        partial = self.credentials_file.with_suffix(".new")
        partial.unlink(missing_ok=True)
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"access_key": access_key, "secret_key": secret_key}, out)
        partial.replace(self.credentials_file)
        return access_key, secret_key

    def client(self):
        """A botocore S3 client of the store, signed with the stack's keys (path-style)."""
        import botocore.session
        from botocore.config import Config

        access_key, secret_key = self.credentials()
        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                connect_timeout=2,
                read_timeout=10,
                retries={"total_max_attempts": 1},
            ),
        )

    def running(self) -> bool:
        return read_pid(self.pidfile) is not None and port_open(self.port)

    def stoppable(self) -> bool:
        return read_pid(self.pidfile) is not None

    def start(self) -> None:
        access_key, secret_key = self.credentials()
        self.env = {
            "CONTROLPLANE_S3_ENDPOINT": self.endpoint,
            "CONTROLPLANE_S3_ACCESS_KEY": access_key,
            "CONTROLPLANE_S3_SECRET_KEY": secret_key,
            "CONTROLPLANE_S3_BUCKET": self.bucket,
        }
        if self.running():
            log(f"S3Proxy already running on {self.endpoint}")
            self._ensure_bucket()
            return
        if port_open(self.port):
            raise StackError(
                f"port {self.port} is taken by another program: set CONTROLPLANE_S3_PORT, "
                "or CONTROLPLANE_S3_ENDPOINT (and its keys) to use an existing S3 store"
            )
        if not self.libs.joinpath(".installed").exists():
            raise StackError(
                f"S3Proxy's jars are not in {self.libs}: run ./stack, which copies them"
            )
        self._write_config(access_key, secret_key)
        log(f"starting S3Proxy on {self.endpoint} (objects in {self.data})")
        proc = spawn_detached(
            [
                shutil.which("java") or "java",
                *self.heap_opts.split(),
                "-XX:+ExitOnOutOfMemoryError",
                f"-Dlogback.configurationFile={self.log_config}",
                "-cp",
                f"{self.libs}/*",
                "org.gaul.s3proxy.Main",
                "--properties",
                str(self.config),
            ],
            self.outfile,
            self.pidfile,
            self.dir,
        )
        self.started_here = True
        seconds = wait_started(
            "S3Proxy",
            proc,
            lambda: port_open(self.port) and "Buckets" in self.client().list_buckets(),
            60,
            f"{self.logfile} and {self.outfile}",
        )
        self.timings["start"] = seconds
        self._ensure_bucket()
        log(f"S3Proxy ready in {seconds:.1f} s: {self.endpoint}, bucket {self.bucket}")

    def stop(self) -> None:
        pid = read_pid(self.pidfile)
        if pid:
            log("stopping S3Proxy")
            terminate(pid, timeout=20)

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        try:
            try:
                client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                    raise
                client.create_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise StackError(
                f"S3Proxy on {self.endpoint} refused the bucket {self.bucket!r} with the keys in "
                f"{self.credentials_file}: {exc} (a server started with other keys: stop it)"
            ) from None

    def _write_config(self, access_key: str, secret_key: str) -> None:
        """Written on every start (port and keys)."""
        self.data.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "s3proxy.endpoint": self.endpoint,
            # Every request signed with the stack's keys, AWS signature V2 or V4.
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": access_key,
            "s3proxy.credential": secret_key,
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.data),
        }
        self.config.write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            + "".join(f"{k}={v}\n" for k, v in settings.items())
        )
        self.config.chmod(0o600)  # it holds the secret key
        # Without a configuration logback logs everything at DEBUG to the console.
        self.log_config.write_text(
            "<!-- Written by scripts/devstack.py on every start; edits are lost. -->\n"
            "<configuration>\n"
            '  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">\n'
            f"    <file>{self.logfile}</file>\n"
            '    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">\n'
            f"      <fileNamePattern>{self.logfile}.%i</fileNamePattern>\n"
            "      <minIndex>1</minIndex><maxIndex>2</maxIndex>\n"
            "    </rollingPolicy>\n"
            '    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">\n'
            "      <maxFileSize>20MB</maxFileSize>\n"
            "    </triggeringPolicy>\n"
            "    <encoder><pattern>%d{ISO8601} %level %logger{30}: %msg%n</pattern></encoder>\n"
            "  </appender>\n"
            '  <root level="INFO"><appender-ref ref="FILE"/></root>\n'
            "</configuration>\n"
        )


# --- Apache Cassandra (optional: ./stack cassandra; started by ./stack test) ---------------


CASSANDRA_PORT = int(os.environ.get("CONTROLPLANE_CASSANDRA_PORT", "59042"))
CASSANDRA_STORAGE_PORT = int(os.environ.get("CONTROLPLANE_CASSANDRA_STORAGE_PORT", "57000"))
CASSANDRA_HEAP_OPTS = os.environ.get("CONTROLPLANE_CASSANDRA_HEAP_OPTS", "-Xms256m -Xmx256m")
# SimpleSnitch puts the one node in this data centre (and rack1).
CASSANDRA_DC = "datacenter1"
# Cassandra's own default superuser, made by the node itself on first start. Kept on purpose: a
# development node on loopback, and the name and password every Cassandra user knows; clients
# must still authenticate (PasswordAuthenticator), so a wrong password is refused as on a real
# cluster. `./stack cassandra` exports them as CONTROLPLANE_CASSANDRA_USER/_PASSWORD.
CASSANDRA_USER = "cassandra"
CASSANDRA_PASSWORD = "cassandra"  # noqa: S105 - see above
# The JPMS part of Cassandra 5.0's conf/jvm17-server.options (the jar ships no conf/): without
# these it stops at start-up, unable to reach the JDK's internals.
CASSANDRA_JVM17_OPTIONS = (
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    # Netty's options from the same file.
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)  # fmt: skip


class Cassandra(Service):
    """One Apache Cassandra 5.0 node (`CassandraDaemon` in the foreground, detached), from
    Maven Central's jars copied by ./stack into var/cassandra/libs (scripts/cassandra/pom.xml
    pins them), with jamm (among them) as its Java agent and the Java 17 options of Cassandra's
    own jvm17-server.options. The jar ships no configuration: cassandra.yaml and logback.xml
    are written on every start. On loopback only, its own ports (none of Cassandra's defaults:
    CQL on 59042, the storage port on 57000, no JMX at all), one token, SimpleSnitch (data
    centre `datacenter1`), small caches and memtables; data, commit log, saved caches and hints
    under var/cassandra, kept across restarts. Clients authenticate (PasswordAuthenticator,
    CassandraAuthorizer) as Cassandra's default superuser, cassandra/cassandra.

    Measured on this 2-core machine (2026-11-28, OpenJDK 17, -Xms256m -Xmx256m), to CQL
    answering as the superuser: first start (empty var/cassandra) 5.0 s alone, 12.2 s cold
    beside HDFS and S3Proxy (HDFS, 12.8 s, is still the slowest); a restart 4.6-4.8 s; RSS
    ~640 MiB once up, ~690 MiB after a few tests (~250 of it the heap); stopping (SIGTERM: the
    node drains, flushing its memtables) 2.6-4.6 s. A first start without
    -Dcassandra.superuser_setup_delay_ms=0 took 16.3 s: the node makes its default superuser
    only 10 s after it is up."""

    def __init__(
        self,
        *,
        var: Path | None = None,
        libs: Path | None = None,
        port: int = CASSANDRA_PORT,
        storage_port: int = CASSANDRA_STORAGE_PORT,
        heap_opts: str = CASSANDRA_HEAP_OPTS,
    ) -> None:
        super().__init__("cassandra")
        var = var or VAR
        self.dir = var / "cassandra"
        self.conf = self.dir / "conf"
        self.config = self.conf / "cassandra.yaml"
        self.log_config = self.conf / "logback.xml"
        self.pidfile = self.dir / "cassandra.pid"
        self.logfile = var / "log" / "cassandra.log"
        # The JVM's own output (start-up failures, crashes); Cassandra logs to cassandra.log.
        self.outfile = var / "log" / "cassandra.out"
        # The jars are the checkout's (./stack copies them there), whatever `var` a test uses.
        self.libs = libs or VAR / "cassandra" / "libs"
        self.port, self.storage_port = port, storage_port
        self.heap_opts = heap_opts
        self.hosts = f"127.0.0.1:{port}"
        self.timings: dict[str, float] = {}
        self.env = {
            "CONTROLPLANE_CASSANDRA_HOSTS": self.hosts,
            "CONTROLPLANE_CASSANDRA_DC": CASSANDRA_DC,
            "CONTROLPLANE_CASSANDRA_USER": CASSANDRA_USER,
            "CONTROLPLANE_CASSANDRA_PASSWORD": CASSANDRA_PASSWORD,
        }

    def cluster(self, user: str = CASSANDRA_USER, password: str = CASSANDRA_PASSWORD):
        """A cassandra-driver Cluster of the node (not yet connected; shut it down after)."""
        import logging

        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import DCAwareRoundRobinPolicy

        # The driver logs each refused connection (the node starting, the superuser not yet
        # made); here the exception says enough.
        logging.getLogger("cassandra").addHandler(logging.NullHandler())
        profile = ExecutionProfile(
            load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=CASSANDRA_DC),
            request_timeout=10,
        )
        return Cluster(
            [("127.0.0.1", self.port)],
            auth_provider=PlainTextAuthProvider(user, password),
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connect_timeout=3,
            control_connection_timeout=3,
        )

    def release_version(self) -> str:
        """Cassandra's version, read over CQL as the superuser (raises if it does not answer)."""
        cluster = self.cluster()
        try:
            session = cluster.connect()
            return session.execute("SELECT release_version FROM system.local").one()[0]
        finally:
            cluster.shutdown()

    def pid(self) -> int | None:
        return read_pid(self.pidfile)

    def running(self) -> bool:
        return self.pid() is not None and port_open(self.port)

    def stoppable(self) -> bool:
        return self.pid() is not None

    def start(self) -> None:
        if self.running():
            log(f"Cassandra already running on {self.hosts}")
            # Started by another ./stack a moment ago, it may not answer yet.
            wait_for("Cassandra", lambda: bool(self.release_version()), 120, self.logfile)
            return
        for port, variable in (
            (self.port, "CONTROLPLANE_CASSANDRA_PORT"),
            (self.storage_port, "CONTROLPLANE_CASSANDRA_STORAGE_PORT"),
        ):
            if port_open(port):
                raise StackError(
                    f"port {port} is taken by another program: set {variable}, or "
                    "CONTROLPLANE_CASSANDRA_HOSTS (and its credentials) to use an existing "
                    "Cassandra"
                )
        jamm = sorted(self.libs.glob("jamm-*.jar"))
        if not self.libs.joinpath(".installed").exists() or not jamm:
            raise StackError(
                f"Cassandra's jars are not in {self.libs}: run ./stack, which copies them"
            )
        first = not (self.dir / "data" / "system").exists()
        self._write_config()
        log(f"starting Cassandra on {self.hosts} (data in {self.dir})")
        proc = spawn_detached(
            [*self._java(jamm[-1]), "org.apache.cassandra.service.CassandraDaemon"],
            self.outfile,
            self.pidfile,
            self.dir,
        )
        self.started_here = True
        seconds = wait_started(
            "Cassandra",
            proc,
            lambda: port_open(self.port) and bool(self.release_version()),
            180,
            f"{self.logfile} and {self.outfile}",
        )
        self.timings["first start" if first else "start"] = seconds
        log(f"Cassandra ready in {seconds:.1f} s: {self.hosts}, data centre {CASSANDRA_DC}")

    def stop(self) -> None:
        pid = self.pid()
        if pid:
            log("stopping Cassandra")
            # SIGTERM: its shutdown hook drains the node (flushes memtables): 7-10 s.
            terminate(pid, timeout=60)

    def _java(self, jamm: Path) -> list[str]:
        return [
            shutil.which("java") or "java",
            *self.heap_opts.split(),
            "-XX:+UseG1GC",
            "-XX:+ParallelRefProcEnabled",
            "-XX:MaxTenuringThreshold=1",
            "-XX:+ExitOnOutOfMemoryError",
            "-Xss256k",
            "-Djava.net.preferIPv4Stack=true",
            f"-javaagent:{jamm}",
            *CASSANDRA_JVM17_OPTIONS,
            f"-Dcassandra.config={self.config.as_uri()}",
            f"-Dcassandra.storagedir={self.dir}",
            f"-Dcassandra.logdir={self.logfile.parent}",
            f"-Dlogback.configurationFile={self.log_config}",
            # Its output stays open (to cassandra.out): without this it closes stdout/stderr.
            "-Dcassandra-foreground=yes",
            # One node: no peers to wait for at start, none to tell at shutdown (2 s each).
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.shutdown_announce_in_ms=0",
            # The default superuser made at once on first start, not 10 s later.
            "-Dcassandra.superuser_setup_delay_ms=0",
            # Where Cassandra looks for trigger jars (none; it warns at start if it is missing).
            f"-Dcassandra.triggers_dir={self.dir / 'triggers'}",
            "-Dchronicle.announcer.disable=true",
            "-cp",
            f"{self.libs}/*",
        ]

    def _write_config(self) -> None:
        """Written on every start (ports, directories)."""
        self.conf.mkdir(parents=True, exist_ok=True)
        self.dir.joinpath("triggers").mkdir(exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "cluster_name": "controlplane-dev",
            "num_tokens": 1,
            "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
            "endpoint_snitch": "SimpleSnitch",
            "listen_address": "127.0.0.1",
            "rpc_address": "127.0.0.1",
            "storage_port": self.storage_port,
            "native_transport_port": self.port,
            "start_native_transport": "true",
            "authenticator": "PasswordAuthenticator",
            "authorizer": "CassandraAuthorizer",
            "role_manager": "CassandraRoleManager",
            "data_file_directories": f"\n  - {self.dir / 'data'}",
            "commitlog_directory": self.dir / "commitlog",
            "saved_caches_directory": self.dir / "saved_caches",
            "hints_directory": self.dir / "hints",
            "cdc_raw_directory": self.dir / "cdc_raw",
            # A new 5.0 node, nothing to stay compatible with: 5.0's formats from the start.
            "storage_compatibility_mode": "NONE",
            "commitlog_sync": "periodic",
            "commitlog_sync_period": "10000ms",
            "commitlog_total_space": "256MiB",
            # Small: a development node at a 256 MiB heap.
            "memtable_allocation_type": "heap_buffers",
            "memtable_heap_space": "32MiB",
            "memtable_offheap_space": "32MiB",
            "key_cache_size": "8MiB",
            "row_cache_size": "0MiB",
            "counter_cache_size": "0MiB",
            "prepared_statements_cache_size": "8MiB",
            "file_cache_size": "16MiB",
            "networking_cache_size": "8MiB",
            "concurrent_reads": 8,
            "concurrent_writes": 8,
            "concurrent_counter_writes": 8,
            "concurrent_compactors": 1,
            "disk_access_mode": "mmap_index_only",
            # Dropping or truncating a table (tests do, often) keeps no snapshot of it.
            "auto_snapshot": "false",
            # One node: no other to keep hints for.
            "hinted_handoff_enabled": "false",
        }
        seeds = f"127.0.0.1:{self.storage_port}"
        self.config.write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            + "".join(f"{k}: {v}\n" for k, v in settings.items())
            + "seed_provider:\n"
            "  - class_name: org.apache.cassandra.locator.SimpleSeedProvider\n"
            "    parameters:\n"
            f'      - seeds: "{seeds}"\n'
        )
        # Without a configuration logback logs everything at DEBUG to the console.
        self.log_config.write_text(
            "<!-- Written by scripts/devstack.py on every start; edits are lost. -->\n"
            '<configuration scan="false">\n'
            '  <appender name="FILE" class="ch.qos.logback.core.rolling.RollingFileAppender">\n'
            f"    <file>{self.logfile}</file>\n"
            '    <rollingPolicy class="ch.qos.logback.core.rolling.FixedWindowRollingPolicy">\n'
            f"      <fileNamePattern>{self.logfile}.%i</fileNamePattern>\n"
            "      <minIndex>1</minIndex><maxIndex>2</maxIndex>\n"
            "    </rollingPolicy>\n"
            '    <triggeringPolicy class="ch.qos.logback.core.rolling.SizeBasedTriggeringPolicy">\n'
            "      <maxFileSize>20MB</maxFileSize>\n"
            "    </triggeringPolicy>\n"
            "    <encoder>\n"
            "      <pattern>%d{ISO8601} %level [%thread] %logger{30}: %msg%n</pattern>\n"
            "    </encoder>\n"
            "  </appender>\n"
            '  <root level="INFO"><appender-ref ref="FILE"/></root>\n'
            "</configuration>\n"
        )


# --- Java 21+ (the schema registry needs it; the other servers run on the default `java`) --


# Where a Java 21+ home is taken from first, in this order (a home: the directory with bin/java).
JAVA21_ENV = ("CONTROLPLANE_JAVA21_HOME", "JAVA21_HOME")
# Where JDKs and JREs are usually installed (Debian's packages and Adoptium's, tarballs, SDKMAN).
JAVA_SEARCH = (
    "/usr/lib/jvm/*",
    "/usr/java/*",
    "/opt/java/*",
    "/opt/*jdk*",
    "/opt/*jre*",
    "/usr/local/*jdk*",
    "~/.sdkman/candidates/java/*",
    "~/.jdks/*",
)


def java_major(home: Path) -> int | None:
    """The feature version (17, 21, 25...) of the Java at `home`, from its `release` file or,
    without one, from `bin/java -version`; None when there is no runnable bin/java."""
    import re

    java = home / "bin" / "java"
    if not (java.is_file() and os.access(java, os.X_OK)):
        return None
    text = ""
    with contextlib.suppress(OSError):
        text = (home / "release").read_text()
    found = re.search(r'^JAVA_VERSION="([^"]*)"', text, re.MULTILINE)
    if found is None:
        try:
            answer = subprocess.run(
                [str(java), "-version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = re.search(r'version "([^"]*)"', answer.stderr)
    version = re.match(r"(\d+)(?:\.(\d+))?", found.group(1)) if found else None
    if version is None:
        return None
    major = int(version.group(1))
    return int(version.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def find_java(minimum: int, what: str) -> Path:
    """The `java` of a Java `minimum`+ on this machine: CONTROLPLANE_JAVA21_HOME or JAVA21_HOME
    when set (and then only it), else JAVA_HOME, the `java` on PATH, then the newest of the
    usual places (JAVA_SEARCH). Raises StackError saying what to install when there is none."""
    for variable in JAVA21_ENV:
        value = os.environ.get(variable, "").strip()
        if not value:
            continue
        major = java_major(Path(value).expanduser())
        if major is None:
            raise StackError(
                f"{variable}={value} is not a Java home (no runnable bin/java in it): set it "
                f"to the home of a JDK or JRE {minimum} or newer"
            )
        if major < minimum:
            raise StackError(
                f"{variable}={value} is Java {major}; {what} needs Java {minimum} or newer"
            )
        return Path(value).expanduser() / "bin" / "java"
    first: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        first.append(Path(os.environ["JAVA_HOME"]))
    on_path = shutil.which("java")
    if on_path:
        first.append(Path(on_path).resolve().parent.parent)
    searched = sorted(
        {Path(home) for pattern in JAVA_SEARCH for home in glob.glob(os.path.expanduser(pattern))}
    )
    found: list[tuple[int, Path]] = []
    seen: set[Path] = set()
    for home in [*first, *searched]:
        key = home.resolve()
        if key in seen:
            continue
        seen.add(key)
        major = java_major(home)
        if major is None:
            continue
        if major >= minimum and home in first:
            return home / "bin" / "java"
        found.append((major, home))
    newest = max(found, key=lambda found_one: found_one[0], default=None)
    if newest is not None and newest[0] >= minimum:
        return newest[1] / "bin" / "java"
    others = ", ".join(f"Java {major} at {home}" for major, home in found) or "no Java at all"
    raise StackError(
        f"{what} needs Java {minimum} or newer and this machine has none ({others}; looked at "
        f"JAVA_HOME, the java on PATH and {', '.join(JAVA_SEARCH)}). Install a JDK or JRE "
        f"{minimum}+ (Eclipse Temurin from https://adoptium.net, or a distribution's "
        f"openjdk-{minimum}-jre-headless or newer) and, if it is not in one of those places, "
        "set CONTROLPLANE_JAVA21_HOME to its home; or set CONTROLPLANE_SCHEMA_REGISTRY_URL to "
        "use an existing registry"
    )


# --- the schema registry (optional: ./stack registry; started by ./stack test) -------------


REGISTRY_PORT = int(os.environ.get("CONTROLPLANE_REGISTRY_PORT", "58081"))
# Quarkus's management interface (health checks, metrics), built into Apicurio's application
# (it cannot be switched off when it runs, only moved): on loopback too, a port of our own.
REGISTRY_MANAGEMENT_PORT = int(
    os.environ.get("CONTROLPLANE_REGISTRY_MANAGEMENT_PORT", str(REGISTRY_PORT + 1))
)
# The same API over TLS (a certificate of the stack's own test CA, var/registry/tls/ca.pem):
# what a connection with `ssl_cafile` is tested against.
REGISTRY_TLS_PORT = int(os.environ.get("CONTROLPLANE_REGISTRY_TLS_PORT", str(REGISTRY_PORT + 2)))
REGISTRY_HEAP_OPTS = os.environ.get("CONTROLPLANE_REGISTRY_HEAP_OPTS", "-Xms32m -Xmx256m")
# Apicurio Registry's Confluent-compatible API (Confluent Schema Registry's REST API, v7).
REGISTRY_API = "/apis/ccompat/v7"
REGISTRY_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
# Confluent's registry checks BACKWARD compatibility unless told otherwise; Apicurio checks
# nothing until a rule is set, so every start sets this one as the global level.
REGISTRY_COMPATIBILITY = "BACKWARD"
REGISTRY_JAVA = 21


class Registry(Service):
    """A schema registry with Confluent Schema Registry's REST API: Apicurio Registry 3.3's
    Quarkus application (`java -jar quarkus-run.jar`), from Maven Central's archive unpacked by
    ./stack into var/registry/dist (scripts/registry/pom.xml pins it), on a Java 21+ found by
    find_java (the rest of the stack runs on Java 17). Its Confluent API is at
    http://127.0.0.1:58081/apis/ccompat/v7; each start sets the global compatibility level to
    BACKWARD (Confluent's default: Apicurio's is none).

    The same API over TLS on https://127.0.0.1:58083 (REGISTRY_TLS_PORT), with a server
    certificate of the stack's test CA (test_certificates: var/registry/tls/ca.pem), for
    connections with `ssl_cafile`.

    Its settings are written on every start to var/registry/config/application.properties
    (Quarkus reads config/ of its working directory, var/registry): its ports (the API, over
    HTTP and TLS, and Quarkus's management interface, which Apicurio's build switches on) on
    127.0.0.1, no authentication, in-memory H2 storage (nothing survives a restart: tests
    register what they need), OpenTelemetry's SDK off, no event sink, no Kafka, Elasticsearch
    or OIDC server configured, so it reaches nothing outside its own process; a small
    connection pool.

    Measured on this 2-core machine (2026-11-28, quiet, Temurin 25, -Xms32m -Xmx256m, serial GC,
    C1 only), to `GET /subjects` answering and the global level set: first start (just
    unpacked) 3.0-3.1 s, a restart 2.9-3.3 s (storage is in memory: every start is a first
    one); RSS ~200 MiB once up, ~210 MiB after the registry tests, ~215 MiB after a few hundred
    requests; it stops (SIGTERM) in under 2 s. With -Xmx256m alone (C2, and an initial heap of
    the whole 256 MiB): 4.0 s and 275-315 MiB. Its only sockets: the two listeners
    on 127.0.0.1 (`ss -ltnp`); under strace it made no outbound connection."""

    def __init__(
        self,
        *,
        var: Path | None = None,
        dist: Path | None = None,
        port: int = REGISTRY_PORT,
        management_port: int = REGISTRY_MANAGEMENT_PORT,
        tls_port: int | None = None,
        heap_opts: str = REGISTRY_HEAP_OPTS,
    ) -> None:
        super().__init__("registry")
        var = var or VAR
        self.dir = var / "registry"
        self.config = self.dir / "config" / "application.properties"
        self.tmp = self.dir / "tmp"
        self.pidfile = self.dir / "registry.pid"
        self.logfile = var / "log" / "registry.log"
        # The JVM's own output (start-up failures, crashes); the registry logs to registry.log.
        self.outfile = var / "log" / "registry.out"
        # The application is the checkout's (./stack unpacks it there), whatever `var` a test uses.
        self.dist = dist or VAR / "registry" / "dist"
        self.port, self.management_port = port, management_port
        self.tls_port = tls_port or (REGISTRY_TLS_PORT if port == REGISTRY_PORT else port + 2)
        self.heap_opts = heap_opts
        self.url = f"http://127.0.0.1:{port}{REGISTRY_API}"
        self.tls_dir = self.dir / "tls"
        self.tls_url = f"https://127.0.0.1:{self.tls_port}{REGISTRY_API}"
        self.timings: dict[str, float] = {}
        self.env = {
            "CONTROLPLANE_SCHEMA_REGISTRY_URL": self.url,
            "CONTROLPLANE_SCHEMA_REGISTRY_TLS_URL": self.tls_url,
            "CONTROLPLANE_SCHEMA_REGISTRY_CA": str(self.tls_dir / "ca.pem"),
        }

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
        """(HTTP status, the answer's JSON or None) of one request to the Confluent API."""
        import json
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - loopback, ours
            self.url + path,
            data=data,
            method=method,
            headers={"Content-Type": REGISTRY_CONTENT_TYPE, "Accept": REGISTRY_CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
                status, text = answer.status, answer.read()
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read()
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, None

    def answers(self) -> bool:
        """Whether its Confluent API answers (`GET /subjects`: 200 and a list)."""
        status, subjects = self.request("GET", "/subjects")
        return status == 200 and isinstance(subjects, list)

    def set_compatibility(self) -> None:
        """The global compatibility level set to BACKWARD (raises if it is refused)."""
        body = {"compatibility": REGISTRY_COMPATIBILITY}
        status, answer = self.request("PUT", "/config", body)
        if status != 200:
            raise StackError(
                f"the schema registry at {self.url} refused PUT /config {body}: HTTP {status} "
                f"{answer}; see {self.logfile}"
            )

    def pid(self) -> int | None:
        return read_pid(self.pidfile)

    def running(self) -> bool:
        return self.pid() is not None and port_open(self.port)

    def stoppable(self) -> bool:
        return self.pid() is not None

    def start(self) -> None:
        if self.running():
            log(f"schema registry already running at {self.url}")
            # Started by another ./stack a moment ago, it may not answer yet.
            wait_for("the schema registry", self.answers, 120, self.logfile)
            if not port_open(self.tls_port):
                raise StackError(
                    f"the schema registry running at {self.url} does not serve TLS on port"
                    f" {self.tls_port} (started by an older ./stack?): ./stack stop, then again"
                )
            self.set_compatibility()
            return
        for port, variable in (
            (self.port, "CONTROLPLANE_REGISTRY_PORT"),
            (self.management_port, "CONTROLPLANE_REGISTRY_MANAGEMENT_PORT"),
            (self.tls_port, "CONTROLPLANE_REGISTRY_TLS_PORT"),
        ):
            if port_open(port):
                raise StackError(
                    f"port {port} is taken by another program: set {variable}, or "
                    "CONTROLPLANE_SCHEMA_REGISTRY_URL to use an existing schema registry"
                )
        runner = self.dist / "quarkus-run.jar"
        if not self.dist.joinpath(".installed").exists() or not runner.exists():
            raise StackError(
                f"Apicurio Registry is not in {self.dist}: run ./stack, which unpacks it"
            )
        java = find_java(REGISTRY_JAVA, "the schema registry (Apicurio Registry 3.3)")
        test_certificates(self.tls_dir, "127.0.0.1")
        self._write_config()
        log(f"starting the schema registry at {self.url} ({java.parent.parent.name})")
        launched = time.monotonic()
        proc = spawn_detached(
            [
                str(java),
                *self.heap_opts.split(),
                # Small and quick to start (measured, see above): one GC thread, C1 only (C2
                # costs ~50 MiB and a second at start, for nothing a development registry does).
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-XX:+ExitOnOutOfMemoryError",
                "-Djava.net.preferIPv4Stack=true",
                f"-Djava.io.tmpdir={self.tmp}",
                "-jar",
                str(runner),
            ],
            self.outfile,
            self.pidfile,
            self.dir,
        )
        self.started_here = True
        wait_started(
            "the schema registry",
            proc,
            lambda: port_open(self.port) and self.answers(),
            120,
            f"{self.logfile} and {self.outfile}",
            since=launched,
        )
        self.set_compatibility()
        seconds = time.monotonic() - launched
        self.timings["start"] = seconds
        log(f"schema registry ready in {seconds:.1f} s: {self.url}")

    def stop(self) -> None:
        pid = self.pid()
        if pid:
            log("stopping the schema registry")
            terminate(pid, timeout=30)

    def _write_config(self) -> None:
        """Written on every start (ports, directories)."""
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            # Loopback only, both of its HTTP servers.
            "quarkus.http.host": "127.0.0.1",
            "quarkus.http.port": self.port,
            "quarkus.management.host": "127.0.0.1",
            "quarkus.management.port": self.management_port,
            "quarkus.http.cors.enabled": "false",
            # And over TLS, on a port of its own, with the stack's test certificate.
            "quarkus.http.ssl-port": self.tls_port,
            "quarkus.http.ssl.certificate.files": self.tls_dir / "server.pem",
            "quarkus.http.ssl.certificate.key-files": self.tls_dir / "server.key",
            "quarkus.http.insecure-requests": "enabled",
            # No authentication (Apicurio's default, said here): a development registry.
            "apicurio.authn.basic-client-credentials.enabled": "false",
            "quarkus.oidc.tenant-enabled": "false",
            # In memory (H2), a small pool: nothing to keep across restarts.
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.jdbc.initial-size": 2,
            "apicurio.datasource.jdbc.min-size": 2,
            "apicurio.datasource.jdbc.max-size": 20,
            "apicurio.storage.snapshot.location": self.tmp,
            "apicurio.import.work-dir": self.tmp,
            # Nothing sent anywhere: no traces, metrics or logs exported, no events.
            "quarkus.otel.sdk.disabled": "true",
            "apicurio.events.kafka.config.bootstrap.servers": "",
            # Its log in var/log as text (rotated at 20 MB, two kept; not at each start), no
            # line per request (access log, audit log, counters).
            "quarkus.log.console.enabled": "false",
            "quarkus.log.file.enabled": "true",
            "quarkus.log.file.path": self.logfile,
            "quarkus.log.file.json.enabled": "false",
            "quarkus.log.file.format": "%d{yyyy-MM-dd HH:mm:ss,SSS} %p [%c{3.}] (%t) %s%e%n",
            "quarkus.log.file.rotation.max-file-size": "20M",
            "quarkus.log.file.rotation.max-backup-index": 2,
            "quarkus.log.file.rotation.rotate-on-boot": "false",
            "quarkus.http.access-log.enabled": "false",
            'quarkus.log.category."io.apicurio.registry.logging.audit".level': "WARN",
            'quarkus.log.category."io.apicurio.registry.storage.metrics".level': "WARN",
            "quarkus.banner.enabled": "false",
        }
        self.config.write_text(
            "# Written by scripts/devstack.py on every start; edits are lost.\n"
            + "".join(f"{k}={v}\n" for k, v in settings.items())
        )


def test_certificates(directory: Path, host: str) -> None:
    """A test CA (ca.pem) and a server certificate it signed for `host` (server.pem,
    server.key), made once in `directory` (kept across starts; readable by this user only):
    for servers the tests reach over TLS. Never for production: the CA's key is thrown away,
    the certificates last ten years."""
    if all((directory / name).exists() for name in ("ca.pem", "server.pem", "server.key")):
        return
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    now = datetime.datetime.now(datetime.UTC)
    until = now + datetime.timedelta(days=3650)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "controlplane test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    try:
        names = [x509.IPAddress(ipaddress.ip_address(host))]
    except ValueError:
        names = [x509.DNSName(host)]
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.SubjectAlternativeName([*names, x509.DNSName("localhost")]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (directory / "server.key").chmod(0o600)
    (directory / "server.pem").write_bytes(server.public_bytes(pem))
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))


# --- the stack ----------------------------------------------------------------------------


class Stack:
    def __init__(self) -> None:
        self.services: list[Service] = []
        self.env = dict(os.environ)
        self.env.setdefault("PYSPARK_PYTHON", PY)
        self.env.setdefault("PYSPARK_DRIVER_PYTHON", PY)
        self.env["CONTROLPLANE_VAR_DIR"] = str(VAR)
        self.env["PATH"] = f"{Path(PY).parent}:{self.env.get('PATH', '')}"

    def wanted(self, *, storage: bool = False) -> list[Service]:
        """The services to start here; with `storage`, HDFS, the S3 store, Cassandra and the
        schema registry too (the tests' `./stack test`; `./stack up` keeps checkpoints and
        files on local disk)."""
        out: list[Service] = []
        if not os.environ.get("DATABASE_URL"):
            out.append(Postgres())
        if not os.environ.get("CELERY_BROKER_URL"):
            out.append(Redis())
        if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            out.append(Kafka())
        if storage:
            out.extend(storage_services())
        return out

    def start_services(self, *, storage: bool = False) -> None:
        VAR.mkdir(parents=True, exist_ok=True)
        # Two ./stack commands starting at once must not both initialise or start a service.
        with open(VAR / ".stack.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            wanted = self.wanted(storage=storage)
            self.services.extend(wanted)
            # HDFS, the S3 store, Cassandra and the registry are JVMs of their own that need
            # none of the others: each starts in a thread while PostgreSQL, Redis and Kafka
            # start in order beside them
            # (the services phase then takes about as long as the slowest of them). A failure
            # anywhere is raised once all have finished starting, so stop_services() sees
            # everything that was started.
            beside = [s for s in wanted if isinstance(s, (Hdfs, S3Proxy, Cassandra, Registry))]
            with ThreadPoolExecutor(max_workers=max(1, len(beside))) as pool:
                futures = [pool.submit(service.start) for service in beside]
                for service in wanted:
                    if service not in beside:
                        service.start()
                for future in futures:
                    future.result()
            for service in wanted:
                self.env.update(service.env)
        # No fallback to DATABASE_URL: the control plane's own database is never a sink.

    def stop_services(self) -> None:
        for service in reversed(self.services):
            if service.started_here:
                with contextlib.suppress(Exception):
                    service.stop()

    def manage(self, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PY, str(ROOT / "manage.py"), *args],
            env=self.env,
            cwd=ROOT,
            check=True,
            text=True,
            capture_output=capture,
        )


def cmd_services(stack: Stack) -> int:
    stack.start_services()
    for key in (
        "DATABASE_URL",
        "CONTROLPLANE_SINK_DATABASE_URL",
        "CELERY_BROKER_URL",
        "KAFKA_BOOTSTRAP_SERVERS",
        *SASL_ENV,
    ):
        if stack.env.get(key):
            # Quoted for `eval`: a password from the environment may hold any character.
            print(f"export {key}={shlex.quote(stack.env[key])}")
    return 0


# The variable that names an existing store of each kind: when it is set, none is started.
STORAGE_ENV = {
    Hdfs: "CONTROLPLANE_HDFS_URL",
    S3Proxy: "CONTROLPLANE_S3_ENDPOINT",
    Cassandra: "CONTROLPLANE_CASSANDRA_HOSTS",
    Registry: "CONTROLPLANE_SCHEMA_REGISTRY_URL",
}


def storage_services() -> list[Service]:
    """HDFS, the S3 store, Cassandra and the schema registry, each unless the environment
    names an existing one."""
    return [kind() for kind, variable in STORAGE_ENV.items() if not os.environ.get(variable)]


def cmd_storage(kind: type[Service]) -> int:
    """`./stack hdfs` / `./stack s3` / `./stack cassandra` / `./stack registry`: the store
    (or registry) left running in the background (`./stack stop` stops it), its environment
    printed for `eval`."""
    variable = STORAGE_ENV[kind]
    if os.environ.get(variable):
        log(f"{variable} is set: that one is used, none is started here")
        return 0
    service = kind()
    with open(_lock_path(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            service.start()
        except BaseException:
            if service.started_here:  # half started (a NameNode without its DataNode, say)
                service.stop()
            raise
    for key, value in service.env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def cmd_cluster(args: list[str]) -> int:
    """A standalone cluster left running in the background (`./stack stop` stops it)."""
    try:
        workers = int(args[0]) if args else 2
    except ValueError:
        workers = 0
    if workers < 1:
        raise StackError(
            f"cluster: the number of workers must be a whole number >= 1, not {args[0]!r}"
        )
    cluster = SparkCluster(workers)
    with open(_lock_path(), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cluster.start()
    (VAR / "spark" / "workers").write_text(str(workers))
    for key, value in cluster.env.items():
        print(f"export {key}={shlex.quote(value)}")
    return 0


def _lock_path() -> Path:
    VAR.mkdir(parents=True, exist_ok=True)
    return VAR / ".stack.lock"


def _cluster() -> SparkCluster:
    try:
        workers = int((VAR / "spark" / "workers").read_text())
    except (OSError, ValueError):
        workers = 2
    return SparkCluster(workers)


def cmd_status(_stack: Stack) -> int:
    services = (Postgres(), Redis(), Kafka(), Hdfs(), S3Proxy(), Cassandra(), Registry())
    for service in (*services, _cluster()):
        if service.running():
            state = "running"
        else:
            state = "partly running" if service.stoppable() else "stopped"
        print(f"{service.name:9} {state}")
    return 0


def cmd_stop(_stack: Stack) -> int:
    services = (Registry(), Cassandra(), S3Proxy(), Hdfs(), Kafka(), Redis(), Postgres())
    for service in (_cluster(), *services):
        if service.stoppable():
            service.stop()
    return 0


def cmd_test(stack: Stack, pytest_args: list[str]) -> int:
    try:
        stack.start_services(storage=True)
        env = stack.env
        # Tests get their own Redis database, so a running `./stack up` worker never eats
        # tasks sent by a test (and the other way round).
        # CONTROLPLANE_TEST_REDIS_DB lets two test runs share one Redis without sharing tasks.
        redis_db = os.environ.get("CONTROLPLANE_TEST_REDIS_DB", "15")
        env["CELERY_BROKER_URL"] = env["CELERY_BROKER_URL"].rsplit("/", 1)[0] + f"/{redis_db}"
        env["CONTROLPLANE_TESTING"] = "1"
        steps = [
            ("ruff (lint)", [PY, "-m", "ruff", "check", "."]),
            ("ruff (format)", [PY, "-m", "ruff", "format", "--check", "."]),
            # The contracts of pyproject.toml's [tool.importlinter] (docs/architecture.md).
            ("import contracts", [str(Path(PY).parent / "lint-imports"), "--no-cache"]),
            ("django checks", [PY, "manage.py", "check", "--fail-level", "WARNING"]),
            (
                # The production profile's deploy checks, with a throwaway key (never stored).
                "django deploy checks (production profile)",
                [
                    "env",
                    "DJANGO_SETTINGS_MODULE=controlplane.settings_production",
                    f"DJANGO_SECRET_KEY={os.urandom(32).hex()}",
                    "DJANGO_ALLOWED_HOSTS=controlplane.example.com",
                    PY,
                    "manage.py",
                    "check",
                    "--deploy",
                    "--fail-level",
                    "WARNING",
                ],
            ),
            ("migrations up to date", [PY, "manage.py", "makemigrations", "--check", "--dry-run"]),
        ]
        for title, command in steps:
            log(title)
            if subprocess.run(command, cwd=ROOT, env=env, check=False).returncode != 0:
                log(f"FAILED: {title}")
                return 1
        # Two processes on two cores: most of the suite's time is spent waiting on drivers,
        # services and restarts, not computing. A test file runs whole in one process
        # (loadfile: module fixtures such as a private stack are made once); each process
        # keeps its own database, Redis database, runs and checkpoints (tests/workers.py).
        workers = os.environ.get("CONTROLPLANE_TEST_WORKERS", "2")
        parallel = ["-n", workers, "--dist", "loadfile"] if workers not in ("", "0", "1") else []
        log(f"pytest ({workers or 1} processes)" if parallel else "pytest")
        return subprocess.run(
            [PY, "-m", "pytest", *parallel, *pytest_args], cwd=ROOT, env=env, check=False
        ).returncode
    finally:
        stack.stop_services()


def cmd_up(stack: Stack) -> int:
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def shutdown(*_args) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, shutdown)
    signal.signal(signal.SIGTERM, shutdown)
    try:
        stack.start_services()
        log("applying database migrations")
        stack.manage("migrate", "--no-input", "-v", "0")
        stack.manage("ensure_admin")
        # Kafka keeps its log on disk across restarts: only storage formatted just now (a new
        # var/kafka) leaves the demo's checkpoint pointing into a log that no longer exists.
        kafka_fresh = any(isinstance(s, Kafka) and s.formatted_here for s in stack.services)
        stack.manage("seed_demo", *(["--kafka-restarted-empty"] if kafka_fresh else []))
        stack.env.setdefault("CONTROLPLANE_URL", f"http://{WEB_HOST}:{WEB_PORT}")
        logs = VAR / "log"
        logs.mkdir(parents=True, exist_ok=True)
        commands = {
            "web": [
                PY,
                "-m",
                "gunicorn",
                "controlplane.wsgi",
                "--bind",
                f"{WEB_HOST}:{WEB_PORT}",
                "--worker-class",
                "gthread",
                "--workers",
                "2",
                "--threads",
                "8",
                "--access-logfile",
                "-",
            ],
            "worker": [
                PY,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--hostname",
                "controlplane@%h",
            ],
            "beat": [PY, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO"],
            # Demo traffic for the demo pipeline: ~200 delivery events/s, 1% malformed.
            "loadgen": [
                PY,
                "-m",
                "jobs.loadgen",
                "--bootstrap",
                stack.env["KAFKA_BOOTSTRAP_SERVERS"],
                "--topic",
                "deliveries",
                "--rate",
                os.environ.get("CONTROLPLANE_DEMO_RATE", "200"),
            ],
        }
        for name, command in commands.items():
            out = open(logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=stack.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            children.append((name, proc))
        wait_for("the web server", lambda: port_open(WEB_PORT, WEB_HOST), 60, logs / "web.log")
        print(
            f"\n  Control plane:  http://{WEB_HOST}:{WEB_PORT}/\n"
            f"  REST API:       http://{WEB_HOST}:{WEB_PORT}/api/\n"
            f"  Admin:          http://{WEB_HOST}:{WEB_PORT}/admin/\n"
            f"  Logs:           {logs}/\n\n  Ctrl-C stops everything this command started.\n",
            flush=True,
        )
        while not stopping:
            for name, proc in children:
                if proc.poll() is not None:
                    log(f"{name} exited with code {proc.returncode}; see {logs / name}.log")
                    stopping = True
            time.sleep(0.5)
        return 0
    except (StackError, subprocess.CalledProcessError) as exc:
        log(f"error: {exc}")
        return 1
    finally:
        log("stopping")
        for _name, proc in reversed(children):
            if proc.poll() is None:
                terminate(proc.pid)
        if children:
            # Pipeline drivers run detached (they outlive a control-plane restart in
            # production); the dev stack stops them with everything else.
            with contextlib.suppress(subprocess.CalledProcessError):
                stack.manage("stop_drivers")
        stack.stop_services()


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    stack = Stack()
    try:
        if command == "up":
            return cmd_up(stack)
        if command == "test":
            return cmd_test(stack, rest)
        if command == "services":
            return cmd_services(stack)
        if command == "cluster":
            return cmd_cluster(rest)
        if command == "hdfs":
            return cmd_storage(Hdfs)
        if command == "s3":
            return cmd_storage(S3Proxy)
        if command == "cassandra":
            return cmd_storage(Cassandra)
        if command == "registry":
            return cmd_storage(Registry)
        if command == "status":
            return cmd_status(stack)
        if command == "stop":
            return cmd_stop(stack)
    except StackError as exc:
        log(f"error: {exc}")
        stack.stop_services()
        return 1
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
