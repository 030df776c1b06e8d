"""A whole control plane of its own, for outage tests: PostgreSQL and Redis started by the
project's own dev-stack code (scripts/devstack.py) on free ports under a temporary directory,
then the web app (gunicorn), a Celery worker with beat, and real drivers, all as separate
processes talking to those services only. A test can stop and start the services under them,
which it could not do to the shared ones the rest of the suite uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import requests

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sink_counts(stack: OutageStack, table: str) -> tuple[int, int]:
    """(rows, distinct ids) in the stack's sink table; (0, 0) before it exists, or while
    its PostgreSQL is down."""
    try:
        with psycopg.connect(stack.sink_dsn, connect_timeout=3) as conn:
            return conn.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"').fetchone()
    except (psycopg.errors.UndefinedTable, psycopg.OperationalError):
        return (0, 0)


def _devstack(var: Path, pg_port: int, redis_port: int):
    """A private copy of scripts/devstack.py whose services live in `var` on these ports
    (the module reads them from the environment when it is loaded)."""
    saved = {
        k: os.environ.get(k)
        for k in ("CONTROLPLANE_VAR_DIR", "CONTROLPLANE_PG_PORT", "CONTROLPLANE_REDIS_PORT")
    }
    os.environ.update(
        CONTROLPLANE_VAR_DIR=str(var),
        CONTROLPLANE_PG_PORT=str(pg_port),
        CONTROLPLANE_REDIS_PORT=str(redis_port),
    )
    try:
        spec = importlib.util.spec_from_file_location(
            f"outage_devstack_{pg_port}", ROOT / "scripts" / "devstack.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class OutageStack:
    def __init__(self, kafka_bootstrap: str) -> None:
        # Reachable by the `postgres` user (the server runs as it when we are root).
        self.var = Path(tempfile.mkdtemp(prefix="cp-outage-", dir="/tmp"))
        os.chmod(self.var, 0o755)  # noqa: S103 - a test directory, no secrets in it
        self.pg_port, self.redis_port, self.web_port = free_port(), free_port(), free_port()
        stack = _devstack(self.var, self.pg_port, self.redis_port)
        self.postgres = stack.Postgres()
        self.redis = stack.Redis()
        self.url = f"http://127.0.0.1:{self.web_port}"
        base = f"postgresql://controlplane@127.0.0.1:{self.pg_port}"
        self.database_url = f"{base}/controlplane"
        self.sink_dsn = f"{base}/controlplane_sink"
        self.env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "CONTROLPLANE_SINK_DATABASE_URL": self.sink_dsn,
            "CELERY_BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "CONTROLPLANE_VAR_DIR": str(self.var),
            "CONTROLPLANE_URL": self.url,
            "CONTROLPLANE_RECONCILE_SECONDS": "1",
            "CONTROLPLANE_HEARTBEAT_SECONDS": "1",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        }
        self.env.pop("CONTROLPLANE_TESTING", None)
        self.children: dict[str, subprocess.Popen] = {}
        self.token = ""

    # -- life cycle ----------------------------------------------------------------------------

    def start(self) -> OutageStack:
        self.postgres.start()
        self.redis.start()
        self.manage("migrate", "--no-input", "-v", "0")
        self.manage("set_role", "ops", "admin", "--create")
        self.token = self.manage("create_api_token", "ops", "--name", "outage").strip()
        self.start_web()
        self.start_worker()
        self.wait_for_web()
        return self

    def start_web(self) -> None:
        self.spawn(
            "web",
            [
                sys.executable, "-m", "gunicorn", "controlplane.wsgi",
                "--bind", f"127.0.0.1:{self.web_port}", "--worker-class", "gthread",
                "--workers", "1", "--threads", "8", "--timeout", "120",
            ],
        )  # fmt: skip

    def wait_for_web(self) -> None:
        wait_until(
            lambda: requests.get(f"{self.url}/healthz", timeout=2).status_code in (200, 503),
            60,
            "the web app to answer",
            every=0.3,
            details=lambda: f"see {self.var / 'web.log'}",
            ignore=(requests.RequestException,),
        )

    def kill(self, name: str) -> None:
        """SIGKILL a process of the control plane (and what it started in its group)."""
        proc = self.children.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=20)

    def shell(self, code: str) -> str:
        """Run Python in the stack's Django (manage.py shell -c); its standard output."""
        return self.manage("shell", "-c", code)

    def start_worker(self) -> None:
        self.spawn(
            "worker",
            [
                sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--beat",
                "--concurrency", "2", "--loglevel", "INFO", "--without-heartbeat",
                "--without-gossip", "--without-mingle",
                "--schedule", str(self.var / "beat-schedule"),
            ],
        )  # fmt: skip

    def spawn(self, name: str, command: list[str]) -> None:
        log = open(self.var / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.children[name] = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def manage(self, *args: str) -> str:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout

    def close(self) -> None:
        for proc in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.children.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if not self.postgres.running():
            self.postgres.start()
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.manage("stop_drivers")
        self.redis.stop()
        self.postgres.stop()
        shutil.rmtree(self.var, ignore_errors=True)

    # -- using it ------------------------------------------------------------------------------

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        timeout = kwargs.pop("timeout", 10)
        return requests.request(
            method,
            f"{self.url}{path}",
            timeout=timeout,
            headers={"Authorization": f"Token {self.token}"},
            **kwargs,
        )

    def log(self, name: str) -> str:
        path = self.var / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""
