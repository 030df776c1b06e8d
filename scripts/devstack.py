"""Starts and stops the development stack: PostgreSQL, Redis and Apache Kafka under var/, then
the control plane itself. Called by ./stack (which has already installed packages, the venv and
Kafka's jars).

Each service is reused when it is already running (started by another ./stack), started
otherwise, and stopped on exit only by the invocation that started it. Services named in the
environment (DATABASE_URL, CELERY_BROKER_URL, KAFKA_BOOTSTRAP_SERVERS) are not started at all.
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

    def stop(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


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
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
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
                if self._answers() and port_open(KAFKA_SASL_PORT):
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


# --- the stack ----------------------------------------------------------------------------


class Stack:
    def __init__(self) -> None:
        self.services: list[Service] = []
        self.env = dict(os.environ)
        self.env.setdefault("PYSPARK_PYTHON", PY)
        self.env.setdefault("PYSPARK_DRIVER_PYTHON", PY)
        self.env["CONTROLPLANE_VAR_DIR"] = str(VAR)
        self.env["PATH"] = f"{Path(PY).parent}:{self.env.get('PATH', '')}"

    def wanted(self) -> list[Service]:
        out: list[Service] = []
        if not os.environ.get("DATABASE_URL"):
            out.append(Postgres())
        if not os.environ.get("CELERY_BROKER_URL"):
            out.append(Redis())
        if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
            out.append(Kafka())
        return out

    def start_services(self) -> None:
        VAR.mkdir(parents=True, exist_ok=True)
        # Two ./stack commands starting at once must not both initialise or start a service.
        with open(VAR / ".stack.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for service in self.wanted():
                self.services.append(service)
                service.start()
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
    for service in (Postgres(), Redis(), Kafka(), _cluster()):
        print(f"{service.name:9} {'running' if service.running() else 'stopped'}")
    return 0


def cmd_stop(_stack: Stack) -> int:
    for service in (_cluster(), Kafka(), Redis(), Postgres()):
        if service.running():
            service.stop()
    return 0


def cmd_test(stack: Stack, pytest_args: list[str]) -> int:
    try:
        stack.start_services()
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
        log("pytest")
        return subprocess.run(
            [PY, "-m", "pytest", *pytest_args], cwd=ROOT, env=env, check=False
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
