"""Two control-plane hosts on one machine, each a machine of its own as far as the control
plane can tell: a network namespace (tests/netns.py) whose only way out is a veth link, over
which it reaches PostgreSQL, Redis, Kafka, HDFS and host A's web app; a PID namespace
(`unshare --pid --mount-proc`: neither sees the other's processes); its own var and runs
directories. Nothing is shared but the services: checkpoints are on HDFS. Real Spark drivers
under load.

Host A runs the web app and a worker with beat; host B a worker. Three pipelines are
started and spread over the two hosts by their room. Through host A's API, a driver on host B
is killed as soon as B launched it, and another stopped once it runs (host B's worker does
both); both start again on B. Then B's link is cut (and one of its drivers dies at that
moment): B's worker and its other driver, which was doing batches, live on, reaching
nothing, and get no batch done. Once B has been silent for the host timeout, both pipelines
come back on host A. When B's link is back, the old driver, whose token was revoked, is
refused at its next report and stops itself without writing on; every sink has every record
exactly once, and the new runs go on undisturbed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import requests

from jobs.storage import storage_for
from tests.kafka_helpers import Load, new_topic
from tests.netns import Link, Network
from tests.outage_stack import ROOT, OutageStack, sink_counts
from tests.stores import base_for, settings_for
from tests.waiting import wait_until

pytestmark = [
    pytest.mark.spark,
    pytest.mark.kafka,
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(c) for c in ("unshare", "nsenter", "ip")),
        reason="network and PID namespaces need root, unshare, nsenter and ip",
    ),
]

HOST_TIMEOUT = 10


class TwoHosts(OutageStack):
    def __init__(self, kafka_bootstrap: str) -> None:
        # Checkpoints on HDFS, under a root of this test's own.
        self.storage = settings_for("hdfs")
        self.checkpoints = base_for("hdfs", None)
        super().__init__(kafka_bootstrap)
        self.kafka_bootstrap = kafka_bootstrap
        self.env.update(
            CONTROLPLANE_HOST_TIMEOUT=str(HOST_TIMEOUT),
            CONTROLPLANE_HOST_HEARTBEAT_SECONDS="1",
            CONTROLPLANE_SPARK_UI_ENABLED="false",
            SPARK_DRIVER_MEMORY="512m",
            CONTROLPLANE_CHECKPOINT_ROOT=self.checkpoints,
            # The keys every host of one control plane shares, given as a deployment gives
            # them (not in a file under a var directory, which each host has its own of).
            DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
            CONTROLPLANE_SECRETS_KEY=secrets.token_urlsafe(32),
        )
        self.hosts: dict[str, subprocess.Popen] = {}
        self.network = Network(self.var)

    def start(self) -> TwoHosts:
        self.postgres.start()
        self.redis.start()
        self.manage("migrate", "--no-input", "-v", "0")
        self.manage("set_role", "ops", "admin", "--create")
        self.token = self.manage("create_api_token", "ops", "--name", "two-hosts").strip()
        a = self.connect()
        worker = [
            sys.executable, "-m", "celery", "-A", "controlplane", "worker",
            "--concurrency", "2", "--loglevel", "INFO", "--without-heartbeat",
            "--without-gossip", "--without-mingle",
        ]  # fmt: skip
        web = [
            sys.executable, "-m", "gunicorn", "controlplane.wsgi",
            "--bind", f"127.0.0.1:{self.web_port}", "--bind", f"{a.inner_ip}:{self.web_port}",
            "--worker-class", "gthread", "--workers", "1", "--threads", "8", "--timeout", "120",
        ]  # fmt: skip
        beat = ["--beat", "--schedule", str(self.var / "host-a" / "beat-schedule")]
        self.start_host("host-a", 3, {"web": web, "worker": [*worker, *beat, "-n", "a@%h"]})
        self.start_host("host-b", 6, {"worker": [*worker, "-n", "b@%h"]})
        self.wait_for_web()
        return self

    def services(self) -> list[tuple[str, int]]:
        """What both hosts reach: this control plane's PostgreSQL and Redis, Kafka, HDFS's
        NameNode (RPC and HTTP) and the addresses the NameNode hands out for its DataNodes
        (data transfer, and HTTP for WebHDFS's redirects)."""
        hdfs = urlsplit(os.environ["CONTROLPLANE_HDFS_URL"])
        found = [("127.0.0.1", self.pg_port), ("127.0.0.1", self.redis_port)]
        found += [address(broker) for broker in self.kafka_bootstrap.split(",")]
        found += [(hdfs.hostname, hdfs.port), address(self.storage.hdfs_http)]
        info = requests.get(
            f"http://{self.storage.hdfs_http}/jmx",
            params={"qry": "Hadoop:service=NameNode,name=NameNodeInfo"},
            timeout=10,
        ).json()["beans"][0]
        for node in json.loads(info["LiveNodes"]).values():
            found += [address(node["xferaddr"]), address(node["infoAddr"])]
        assert {h for h, _ in found} <= {"127.0.0.1", "localhost"}, found  # forwarded as such
        return sorted({("127.0.0.1", p) for _, p in found})

    def connect(self) -> Link:
        """Both hosts' namespaces and links, and the forwarders that carry what they say to
        the services, and host B's drivers' reports to host A's web app, over their own link
        only (the root namespace passes them on). Host A's link."""
        a, b = self.network.add("host-a"), self.network.add("host-b")
        services, web = self.services(), self.web_port
        outside = {f"{x.outer_ip}:{p}": f"{h}:{p}" for x in (a, b) for h, p in services}
        # Host A's web app, for this test (the root namespace) and for host B's drivers.
        outside[f"127.0.0.1:{web}"] = outside[f"{b.outer_ip}:{web}"] = f"{a.inner_ip}:{web}"
        self.network.forward(outside)
        for link, extra in ((a, []), (b, [("127.0.0.1", web)])):
            routes = {f"{h}:{p}": f"{link.outer_ip}:{p}" for h, p in [*services, *extra]}
            self.network.forward(routes, inside=link)
        return a

    def start_host(self, name: str, drivers: int, commands: dict[str, list[str]]) -> None:
        """The host's processes under one init in a PID namespace of their own, in its
        network namespace; its own var and runs directories (checkpoints are on HDFS)."""
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
            "CONTROLPLANE_VAR_DIR": str(self.var / name),
            "CONTROLPLANE_RUNS_ROOT": str(self.var / name / "runs"),
        }
        (self.var / name).mkdir()
        self.hosts[name] = subprocess.Popen(
            [
                *self.network.links[name].enter(),
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
        try:
            for name in self.network.links:
                self.network.restore(name)  # its processes end sooner over a live link
            for proc in self.hosts.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for proc in self.hosts.values():
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            super().close()
        finally:
            try:
                self.network.close()
            finally:
                remove_tree(self.checkpoints, self.storage)


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def remove_tree(root: str, settings) -> None:
    """Delete an HDFS tree (its snapshots first: HDFS deletes no directory that has some)."""
    store = storage_for(root, settings)
    with contextlib.suppress(Exception):  # tidying up must not hide the test's own failure
        for entry in store.list(root):
            for snapshot in store.snapshots(entry.path):
                store.delete_snapshot(entry.path, snapshot)
        store.remove_tree(root)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap):
    stack = TwoHosts(kafka_bootstrap)
    try:
        yield stack.start()
    finally:
        stack.close()


def wait(predicate, timeout: float, what: str, stack: TwoHosts) -> None:
    """Poll `predicate()` (HTTP calls to the stack, processes: every 0.5 s) until it holds;
    any error (a run not listed yet, a process gone) counts as "not yet". On a timeout: the
    pipelines and both hosts' workers' logs."""

    def details() -> str:
        # Each pipeline's status and health, and its current run: where, in what state.
        shown = []
        for p in stack.api("GET", "/api/pipelines/").json()["results"]:
            runs = stack.api("GET", f"/api/pipelines/{p['name']}/runs/").json()["results"]
            run = runs[0] if runs else {}
            shown.append(
                f"{p['name']}: {p['status']} ({p['health']['state']}: {p['health']['why']}),"
                f" run {run.get('generation')} {run.get('state')} on {run.get('host')!r}"
                f" ({run.get('cause') or '-'}; {run.get('summary') or ''})"
            )
        pipelines = "\n  ".join(shown)
        return (
            f"pipelines:\n  {pipelines}\n"
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


def launched(stack: TwoHosts, name: str, host: str) -> bool:
    run = current(stack, name)
    return run["state"] == "running" and run["host"] == host


def batched(stack: TwoHosts, name: str, generation: int) -> bool:
    """Whether the pipeline's run `generation` has reported a batch done."""
    run = current(stack, name)
    return run["generation"] == generation and run["last_batch_id"] is not None


def host_state(stack: TwoHosts, name: str) -> str:
    return next(h["state"] for h in stack.api("GET", "/api/hosts/").json() if h["name"] == name)


def batches(log: Path | str) -> list[str]:
    """The batches a driver's log says its sink was given (written, or skipped as a replay)."""
    text = log.read_text(errors="replace") if isinstance(log, Path) else log
    return re.findall(r"INFO jobs\.pipeline: batch (\d+)", text)


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
        # Killed through host A's API as soon as host B launched it: host B's worker kills
        # it. And p3 again at once, B being the least loaded host for it: its new driver
        # starts beside the others (it is the one that will be cut off with B, mid-stream).
        wait(lambda: launched(stack, "p3", "host-b"), 240, "p3 launched", stack)
        response = stack.api("POST", "/api/pipelines/p3/kill/", json={"reason": "drill"})
        assert response.status_code == 202, response.text
        wait(lambda: current(stack, "p3")["state"] == "exited", 60, "p3 killed", stack)
        p3 = current(stack, "p3")
        assert (p3["host"], p3["cause"]) == ("host-b", "killed"), p3
        wait(lambda: not stack.drivers("host-b", "p3"), 30, "p3 gone", stack)
        assert stack.api("POST", "/api/pipelines/p3/start/").status_code == 202
        for name, host in placed.items():
            wait(
                lambda n=name, h=host: running_on(stack, n, h, tables[n], int(n == "p3")),
                240,
                name,
                stack,
            )
        # Each host's namespace sees its own drivers, not the other's.
        seen_a, seen_b = stack.seen_from("host-a"), stack.seen_from("host-b")
        assert any("/host-a/runs/p1/" in c for c in seen_a), seen_a
        assert not any("/host-b/runs/" in c for c in seen_a), seen_a
        assert any("/host-b/runs/p2/" in c for c in seen_b), seen_b
        assert not any("/host-a/runs/" in c for c in seen_b), seen_b

        # Stopped through host A's API: host B's worker asks its driver to stop.
        assert stack.api("POST", "/api/pipelines/p2/stop/").status_code == 202
        wait(lambda: current(stack, "p2")["state"] == "exited", 90, "p2 stopped", stack)
        p2 = current(stack, "p2")
        assert (p2["host"], p2["cause"]) == ("host-b", "stopped"), p2
        wait(lambda: not stack.drivers("host-b", "p2"), 30, "p2 gone", stack)
        # p3 is doing batches on its checkpoint (on HDFS) when B is cut off ...
        wait(lambda: batched(stack, "p3", 2), 240, "p3's batches on B", stack)
        (survivor,) = stack.drivers("host-b", "p3", "jobs.supervise")
        log = Path(next(a for a in survivor.cmdline() if "/host-b/runs/p3/" in a), "driver.log")
        # ... and p2 has started again, on B too.
        assert stack.api("POST", "/api/pipelines/p2/start/").status_code == 202
        wait(lambda: running_on(stack, "p2", "host-b", tables["p2"], 1), 240, "p2", stack)

        # Host B's link is cut, and p2's driver dies at that moment; B's worker and p3's
        # driver live on, cut off: they reach nothing (the database, the broker, Kafka,
        # HDFS, the web app), and nothing reaches them.
        stack.network.cut("host-b")
        cut_at = time.monotonic()
        (doomed,) = stack.drivers("host-b", "p2", "jobs.supervise")
        os.killpg(os.getpgid(doomed.pid), signal.SIGKILL)
        assert not stack.network.reaches("host-b", stack.pg_port)
        assert stack.network.reaches("host-a", stack.pg_port)
        # (A moment after the cut: a batch whose last write got through may still log.)
        done_at_cut = batches(log)
        wait(lambda: current(stack, "p2")["cause"] == "host-lost", 60, "p2 lost", stack)
        wait(lambda: current(stack, "p3")["generation"] == 3, 60, "p3 lost", stack)
        assert time.monotonic() - cut_at >= HOST_TIMEOUT - 2  # not before the timeout
        for name in ("p2", "p3"):
            wait(lambda n=name: running_on(stack, n, "host-a", tables[n], 2), 240, name, stack)
        # All the while B's worker and p3's old driver ran on: a host cut off, not a dead
        # one. And the driver got no batch done (no Kafka, no sink, no HDFS to commit to).
        assert stack.processes("host-b", "celery")
        assert survivor.is_running()
        assert batches(log) == done_at_cut

        # B's link is back: p3's old driver, its token revoked, is refused at its next
        # report and stops itself.
        stack.network.restore("host-b")
        wait(
            lambda: not stack.drivers("host-b", "p3"),
            90,
            "p3's old driver to stop itself",
            stack,
        )
        text = log.read_text(errors="replace")
        refused = text.find("the control plane refused this run (409)")
        # Or, cut off from HDFS long enough (a slow machine takes longer to place p2 and p3
        # on A), its batch failed on its store and it ended by itself first: either way it
        # is gone and committed nothing after the cut (above).
        cut_off = "All datanodes" in text or "could not be reached" in text
        assert refused >= 0 or cut_off, text[-3000:]

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
        # B is back (its worker heard again), and the new runs on A went on undisturbed by
        # the old driver or B's return: each pipeline failed once, when B was lost, and its
        # run on A is the one that took over.
        wait(lambda: host_state(stack, "host-b") == "up", 60, "host B back", stack)
        for name in ("p2", "p3"):
            failures = stack.api("GET", f"/api/pipelines/{name}/failures/").json()["results"]
            assert [f["cause"] for f in failures] == ["host-lost"], name
            run = current(stack, name)
            assert (run["generation"], run["state"], run["host"]) == (3, "running", "host-a")
        # And the old driver wrote no batch once refused, but for the one in flight: a driver
        # whose run has ended must not write on beside the new one (checked last, after what
        # it may have harmed).
        late = batches(text[refused:])
        assert len(late) <= 1, f"p3's old driver, once refused, still wrote batches {late}"
    finally:
        if load is not None:
            load.stop()
