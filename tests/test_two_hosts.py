"""Two control-plane hosts on one machine, each in a PID namespace of its own (`unshare
--pid --mount-proc`: neither sees the other's processes), sharing PostgreSQL, Redis and
Kafka, with real Spark drivers under load.

Host A runs the web app and a worker with beat; host B a worker. Three pipelines are
started and spread over the two hosts by their room. Through host A's API, a pipeline
whose driver is on host B is stopped and killed (host B's worker does it). Then host B's
worker and one of its drivers are SIGKILLed while another of its drivers lives on: once B
has been silent for the host timeout, both pipelines come back on host A; the driver that
outlived its revoked token is refused at its next report and stops itself; every sink has
every record exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.kafka_helpers import Load, new_topic
from tests.outage_stack import ROOT, OutageStack, sink_counts
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.kafka,
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("unshare"), reason="PID namespaces need root"
    ),
]

HOST_TIMEOUT = 10


class TwoHosts(OutageStack):
    def __init__(self, kafka_bootstrap: str) -> None:
        super().__init__(kafka_bootstrap)
        self.env.update(
            CONTROLPLANE_HOST_TIMEOUT=str(HOST_TIMEOUT),
            CONTROLPLANE_HOST_HEARTBEAT_SECONDS="1",
            CONTROLPLANE_SPARK_UI_ENABLED="false",
            SPARK_DRIVER_MEMORY="512m",
        )
        self.hosts: dict[str, subprocess.Popen] = {}

    def start(self) -> TwoHosts:
        self.postgres.start()
        self.redis.start()
        self.manage("migrate", "--no-input", "-v", "0")
        self.manage("set_role", "ops", "admin", "--create")
        self.token = self.manage("create_api_token", "ops", "--name", "two-hosts").strip()
        worker = [
            sys.executable, "-m", "celery", "-A", "controlplane", "worker",
            "--concurrency", "2", "--loglevel", "INFO", "--without-heartbeat",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        web = [
            sys.executable, "-m", "gunicorn", "controlplane.wsgi",
            "--bind", f"127.0.0.1:{self.web_port}", "--worker-class", "gthread",
            "--workers", "1", "--threads", "8", "--timeout", "120",
        ]  # fmt: skip
        beat = ["--beat", "--schedule", str(self.var / "beat-schedule")]
        self.start_host("host-a", 3, {"web": web, "worker": [*worker, *beat, "-n", "a@%h"]})
        self.start_host("host-b", 6, {"worker": [*worker, "-n", "b@%h"]})
        self.wait_for_web()
        return self

    def start_host(self, name: str, drivers: int, commands: dict[str, list[str]]) -> None:
        """The host's processes under one init in a PID namespace of their own; its own
        runs directory (only the checkpoints are shared)."""
        spec = {
            process: {"command": command, "log": str(self.var / f"{name}-{process}.log")}
            for process, command in commands.items()
        }
        spec_path = self.var / f"{name}.json"
        spec_path.write_text(json.dumps(spec))
        env = {
            **self.env,
            "CONTROLPLANE_HOST_NAME": name,
            "CONTROLPLANE_HOST_DRIVERS": str(drivers),
            "CONTROLPLANE_RUNS_ROOT": str(self.var / name / "runs"),
            "CONTROLPLANE_CHECKPOINT_ROOT": str(self.var / "checkpoints"),
        }
        self.hosts[name] = subprocess.Popen(
            [
                "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                sys.executable, str(ROOT / "tests" / "drivers" / "nshost.py"), str(spec_path),
            ],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def processes(self, host: str, *words: str) -> list[psutil.Process]:
        """Processes of `host` (seen from outside its namespace) whose command line has
        every one of `words`."""
        found = []
        for process in psutil.process_iter(["cmdline", "environ"]):
            with contextlib.suppress(psutil.Error):
                environ = process.info.get("environ") or {}
                args = " ".join(process.info.get("cmdline") or [])
                if environ.get("CONTROLPLANE_HOST_NAME") == host and all(w in args for w in words):
                    found.append(process)
        return found

    def drivers(self, host: str, pipeline: str, *words: str) -> list[psutil.Process]:
        """The pipeline's driver processes on `host` (found by its runs directory there)."""
        return [
            p
            for p in psutil.process_iter(["cmdline"])
            if any(f"{self.var}/{host}/runs/{pipeline}/" in a for a in p.info["cmdline"] or [])
            and all(w in " ".join(p.info["cmdline"]) for w in words)
        ]

    def seen_from(self, host: str) -> list[str]:
        """Command lines of every process that `host`'s namespace sees (its /proc)."""
        init = psutil.Process(self.hosts[host].pid).children()[0].pid
        proc = Path(f"/proc/{init}/root/proc")
        out = []
        for entry in proc.iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    out.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        return out

    def log(self, name: str) -> str:
        path = self.var / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def close(self) -> None:
        for proc in self.hosts.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.hosts.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        super().close()


@pytest.fixture(scope="module")
def stack(kafka_bootstrap):
    stack = TwoHosts(kafka_bootstrap).start()
    try:
        yield stack
    finally:
        stack.close()


def wait(predicate, timeout: float, what: str, stack: TwoHosts) -> None:
    """Poll `predicate()` (HTTP calls to the stack, processes: every 0.5 s) until it holds;
    any error (a run not listed yet, a process gone) counts as "not yet". On a timeout: the
    pipelines and both hosts' workers' logs."""

    def details() -> str:
        pipelines = stack.api("GET", "/api/pipelines/").text[-3000:]
        return (
            f"pipelines: {pipelines}\n"
            f"host A worker: {stack.log('host-a-worker')[-2500:]}\n"
            f"host B worker: {stack.log('host-b-worker')[-2500:]}"
        )

    wait_until(predicate, timeout, what, every=0.5, details=details, ignore=(Exception,))


def current(stack: TwoHosts, name: str) -> dict:
    return stack.api("GET", f"/api/pipelines/{name}/runs/").json()["results"][0]


def running_on(stack: TwoHosts, name: str, host: str, table: str, after: int = 0) -> bool:
    run = current(stack, name)
    return (
        run["state"] == "running"
        and run["host"] == host
        and run["generation"] > after
        and sink_counts(stack, table)[0] > 0
    )


NAMES = ("p1", "p2", "p3")


def test_two_hosts_share_the_fleet_and_one_survives_the_other(stack, kafka_bootstrap):
    for body in (
        {"name": "events", "kind": "kafka", "settings": {"bootstrap_servers": [kafka_bootstrap]}},
        {"name": "warehouse", "kind": "postgres", "settings": {"dsn": stack.sink_dsn}},
    ):
        assert stack.api("POST", "/api/connections/", json=body).status_code == 201
    topic = new_topic(kafka_bootstrap)
    tables = {name: f"{name}_{topic.replace('-', '_')}" for name in NAMES}
    for name in NAMES:
        spec = {
            "source": {
                "connection": "events",
                "topics": [topic],
                "schema": "id STRING, n INT",
                "starting_offsets": "earliest",
            },
            "sink": {"connection": "warehouse", "table": tables[name]},
            "trigger": {"interval_seconds": 1},
            "restart_policy": {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 1},
        }
        response = stack.api("POST", "/api/pipelines/", json={"name": name, "spec": spec})
        assert response.status_code == 201, response.text
    load = Load(kafka_bootstrap, topic, rate=100)
    try:
        # Both hosts heard first: a worker slow to start on a busy machine is not yet a host
        # the coordinator can place on (it would place all three on A).
        wait(
            lambda: (
                {h["name"] for h in stack.api("GET", "/api/hosts/").json() if h["state"] == "up"}
                >= {"host-a", "host-b"}
            ),
            120,
            "both hosts up",
            stack,
        )
        # Wanted running all at once: the coordinator places them in one tick, by name, each
        # on the host least loaded for its room (A takes 3, B 6): p1 on A, p2 and p3 on B.
        stack.shell(
            "from controlplane.definitions.models import Pipeline;"
            "Pipeline.objects.update(desired_state='running')"
        )
        placed = {"p1": "host-a", "p2": "host-b", "p3": "host-b"}
        for name, host in placed.items():
            wait(lambda n=name, h=host: running_on(stack, n, h, tables[n]), 240, name, stack)
        # Each host's namespace sees its own drivers, not the other's.
        seen_a, seen_b = stack.seen_from("host-a"), stack.seen_from("host-b")
        assert any("/host-a/runs/p1/" in c for c in seen_a), seen_a
        assert not any("/host-b/runs/" in c for c in seen_a), seen_a
        assert any("/host-b/runs/p2/" in c for c in seen_b), seen_b
        assert not any("/host-a/runs/" in c for c in seen_b), seen_b

        # Stopped through host A's API: host B's worker asks its driver to stop.
        assert stack.api("POST", "/api/pipelines/p2/stop/").status_code == 202
        # Killed through host A's API: host B's worker kills it.
        response = stack.api("POST", "/api/pipelines/p3/kill/", json={"reason": "drill"})
        assert response.status_code == 202, response.text
        wait(lambda: current(stack, "p2")["state"] == "exited", 90, "p2 stopped", stack)
        wait(lambda: current(stack, "p3")["state"] == "exited", 60, "p3 killed", stack)
        p2, p3 = current(stack, "p2"), current(stack, "p3")
        assert (p2["host"], p2["cause"]) == ("host-b", "stopped"), p2
        assert (p3["host"], p3["cause"]) == ("host-b", "killed"), p3
        for name in ("p2", "p3"):
            wait(lambda n=name: not stack.drivers("host-b", n), 30, f"{name} gone", stack)

        # Both again: B is the least loaded host for them.
        for name in ("p2", "p3"):
            assert stack.api("POST", f"/api/pipelines/{name}/start/").status_code == 202
        for name in ("p2", "p3"):
            wait(lambda n=name: running_on(stack, n, "host-b", tables[n], 1), 240, name, stack)
        (survivor,) = stack.drivers("host-b", "p3", "jobs.supervise")
        survivor_dir = next(a for a in survivor.cmdline() if "/host-b/runs/p3/" in a)

        # Host B's worker is killed, and p2's driver with it; p3's driver lives on.
        for process in stack.processes("host-b", "celery"):
            with contextlib.suppress(psutil.Error):
                process.kill()
        (doomed,) = stack.drivers("host-b", "p2", "jobs.supervise")
        os.killpg(os.getpgid(doomed.pid), signal.SIGKILL)
        killed_at = time.monotonic()
        wait(lambda: current(stack, "p2")["cause"] == "host-lost", 60, "p2 lost", stack)
        wait(lambda: current(stack, "p3")["generation"] == 3, 60, "p3 lost", stack)
        assert time.monotonic() - killed_at >= HOST_TIMEOUT - 2  # not before the timeout
        for name in ("p2", "p3"):
            wait(lambda n=name: running_on(stack, n, "host-a", tables[n], 2), 240, name, stack)
        # p3's old driver was refused at its next report and stopped itself.
        wait(
            lambda: not stack.drivers("host-b", "p3"),
            90,
            "p3's old driver to stop itself",
            stack,
        )
        driver_log = Path(survivor_dir, "driver.log").read_text(errors="replace")
        assert "the control plane refused this run (409)" in driver_log

        time.sleep(2)  # records after the hand-over too
        produced, load = load.stop(), None
        for name in NAMES:
            wait(
                lambda n=name: sink_counts(stack, tables[n])[0] >= produced,
                240,
                f"{produced} rows in {name}",
                stack,
            )
            assert sink_counts(stack, tables[name]) == (produced, produced), name  # exactly once
        failures = stack.api("GET", "/api/pipelines/p3/failures/").json()["results"]
        assert [f["cause"] for f in failures] == ["host-lost"]
    finally:
        if load is not None:
            load.stop()
