"""Machines of their own on one machine, for tests (tests/test_two_hosts.py): each host a
network namespace joined to the root namespace by a veth pair, 10.231.N.1/30 on the root's
end and 10.231.N.2/30 on the host's (N free on this machine; addresses of no other network).

The services the hosts share listen on the root namespace's 127.0.0.1, and Kafka and HDFS
hand out 127.0.0.1 addresses (the broker's advertised listener, the DataNode's hostname), which
a namespace's own loopback does not reach. So TCP forwarders (tests/drivers/forward.py) make
them answer there: inside each host, 127.0.0.1:PORT -> 10.231.N.1:PORT over its link; in the
root namespace, 10.231.N.1:PORT -> 127.0.0.1:PORT. Everything a host says to the others goes
over its link, and `cut` (its root end down) cuts all of it at once: connections hang, new
ones fail, as between machines, while the host's processes live on; `restore` brings it back.

Root only (`ip netns`, `nsenter`). `close` removes the namespaces, links and forwarders;
those of a test process that died without closing are removed by the next one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

FORWARD = Path(__file__).resolve().parent / "drivers" / "forward.py"
PREFIX = "10.231"
LOCK = Path("/tmp/cp-netns.lock")
# Names carry the pid of the test process that made them: netns "cp-PID-NAME", veth ends
# "cvPIDIo" (root) and "cvPIDIi" (host), I the host's index (interface names: 15 bytes).
NETNS_NAME = re.compile(r"^cp-(\d+)-")
LINK_NAME = re.compile(r"^cv(\d+)\d[oi]$")


def ip(*args: str) -> str:
    return subprocess.run(
        ["ip", *args], check=True, capture_output=True, text=True, timeout=30
    ).stdout


@dataclass(frozen=True)
class Link:
    name: str  # the host's
    netns: str
    outer: str  # the veth end in the root namespace
    outer_ip: str
    inner_ip: str

    def enter(self) -> list[str]:
        """A command line's prefix that runs it in this host's network namespace."""
        return ["nsenter", f"--net=/run/netns/{self.netns}", "--"]


class Network:
    def __init__(self, logs: Path) -> None:
        self.logs = logs  # the forwarders' error output, forward-N.log
        self.links: dict[str, Link] = {}
        self.forwarders: list[subprocess.Popen] = []
        sweep()

    def add(self, name: str) -> Link:
        """A host `name`: its namespace (loopback up) and its link, up."""
        index = len(self.links)
        netns = f"cp-{os.getpid()}-{name}"
        outer, inner = f"cv{os.getpid()}{index}o", f"cv{os.getpid()}{index}i"
        with LOCK.open("a") as lock:  # one free /30 each, also with another test run at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = set(re.findall(rf"inet {re.escape(PREFIX)}\.(\d+)\.", ip("-4", "-o", "addr")))
            block = next(str(n) for n in range(256) if str(n) not in used)
            link = Link(name, netns, outer, f"{PREFIX}.{block}.1", f"{PREFIX}.{block}.2")
            self.links[name] = link  # from here on, close() removes it
            ip("netns", "add", netns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
            ip("addr", "add", f"{link.outer_ip}/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("-n", netns, "addr", "add", f"{link.inner_ip}/30", "dev", inner)
        ip("-n", netns, "link", "set", inner, "up")
        ip("-n", netns, "link", "set", "lo", "up")
        return link

    def forward(self, routes: dict[str, str], inside: Link | None = None) -> None:
        """Forward each LISTEN (host:port) to its TARGET, in `inside`'s namespace or the
        root's; returns once every address listens."""
        command = [sys.executable, str(FORWARD), *(f"{a}={b}" for a, b in routes.items())]
        log = self.logs / f"forward-{len(self.forwarders)}.log"
        with log.open("ab") as errors:
            proc = subprocess.Popen(
                [*(inside.enter() if inside else []), *command],
                stdout=subprocess.PIPE,
                stderr=errors,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        self.forwarders.append(proc)
        if proc.stdout.readline().strip() != "ready":
            proc.wait(10)
            raise RuntimeError(f"forwarder {routes} did not start: {log.read_text()[-2000:]}")

    def cut(self, name: str) -> None:
        """Host `name` loses its link (the root's end goes down): it reaches nothing, and
        nothing reaches it."""
        ip("link", "set", self.links[name].outer, "down")

    def restore(self, name: str) -> None:
        ip("link", "set", self.links[name].outer, "up")

    def reaches(self, name: str, port: int, timeout: float = 1.0) -> bool:
        """Whether a TCP connection from host `name` to the root's end of its link, `port`,
        is made within `timeout` seconds."""
        link = self.links[name]
        probe = (
            "import socket, sys\n"
            f"try: socket.create_connection(({link.outer_ip!r}, {port}), timeout={timeout})\n"
            "except OSError: sys.exit(1)\n"
        )
        command = [*link.enter(), sys.executable, "-I", "-S", "-c", probe]
        return subprocess.run(command, timeout=timeout + 30).returncode == 0

    def close(self) -> None:
        for proc in self.forwarders:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.forwarders:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for link in self.links.values():
            remove(link.netns, link.outer)
        self.links.clear()


def remove(netns: str | None, outer: str | None) -> None:
    """Delete a namespace (its veth end goes with it, and the pair's other end) and a link
    end; whichever is already gone is not an error."""
    if netns:
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
    if outer:
        subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)


def sweep() -> None:
    """Remove what test processes that are gone left behind (killed before their close)."""

    def gone(pid: str) -> bool:
        return int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists()

    for line in ip("netns", "list").splitlines():
        netns = line.split()[0] if line.strip() else ""
        if (found := NETNS_NAME.match(netns)) and gone(found[1]):
            remove(netns, None)
    for line in ip("-o", "link").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if (found := LINK_NAME.match(name)) and gone(found[1]):
            remove(None, name)
