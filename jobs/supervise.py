"""A small supervisor around one driver process: `python -m jobs.supervise RUN_DIR -- CMD...`.

RUN_DIR is a run's directory, or a shared application's (`app.json` instead of `run.json`).

It starts CMD (spark-submit), records the driver's pid, and the moment the driver exits
writes RUN_DIR/exit.json with the exit code, the tail of its error output and the driver's
verdict on its failure (RUN_DIR/failure.json, permanent or transient: jobs.failures, if the
driver wrote one), and sends the same to the control plane (`POST /api/runs/{id}/exit/`,
with the run's token from run.json), so a death is known within a second, not at the next
tick or heartbeat timeout. The report is best effort: if the control plane is down, the
reconciler finds exit.json later. SIGTERM and SIGINT are passed on to the driver. Plain
Python, standard library only (jobs.failures is, at import).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from jobs import failures

TAIL_LINES = 60


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # atomic: a reader never sees half a file


def detach() -> None:
    """Become a daemon: the launching process (a Celery worker) must neither wait for us nor
    keep us as a zombie. Prints our pid for the launcher, then leaves its session."""
    read_end, write_end = os.pipe()
    if os.fork() > 0:
        os.close(write_end)
        # The first child reports the grandchild's pid; the launcher reads it from stdout.
        sys.stdout.write(os.read(read_end, 64).decode())
        sys.stdout.flush()
        os._exit(0)
    os.close(read_end)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    # Lead a process group of our own: the driver and everything it starts inherit it, so
    # the control plane can kill the whole tree with killpg(our pid).
    os.setpgid(0, 0)
    os.write(write_end, f"{os.getpid()}\n".encode())
    os.close(write_end)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--detach"]:
        argv = argv[1:]
        detach()
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m jobs.supervise [--detach] RUN_DIR -- CMD...", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    command = argv[2:]
    log_path = run_dir / "driver.log"
    with open(log_path, "ab") as log:
        driver = subprocess.Popen(  # noqa: S603 - the launcher's own command line
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    write_json(run_dir / "driver.json", {"pid": driver.pid, "started_at": time.time()})

    def forward(signum, _frame):
        if driver.poll() is None:
            driver.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = driver.wait()
    report = {"exit_code": code, "ended_at": time.time(), "error_tail": error_tail(log_path)}
    verdict = failures.read_verdict(run_dir) if code != 0 else None
    if verdict is not None:
        report["failure"] = verdict
    write_json(run_dir / "exit.json", report)
    send_exit_report(run_dir, report)
    reap_group()
    return code


def reap_group() -> None:
    """Kill what the driver left in our process group: when the JVM dies hard, the Python
    driver program it started would otherwise live on, orphaned. Only when we lead the
    group (detached), never a group we merely joined."""
    me = os.getpid()
    if os.getpgrp() != me:
        return
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid, group = int(stat.parent.name), int(fields[2])
        except (OSError, ValueError, IndexError):
            continue
        if group == me and pid != me:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def send_exit_report(run_dir: Path, report: dict, timeout: float = 5.0) -> bool:
    """Tell the control plane now; False (and nothing else) if it cannot be reached."""
    try:
        # A run's directory has run.json; a shared application's has app.json, which names
        # where its exit is reported.
        config = run_dir / "run.json"
        if not config.exists():
            config = run_dir / "app.json"
        control = json.loads(config.read_text()).get("control_plane") or {}
        url = control.get("exit_url") or (
            f"{control['url'].rstrip('/')}/api/runs/{control['run_id']}/exit/"
        )
        request = urllib.request.Request(  # noqa: S310 - the control plane's own http(s) URL
            url,
            data=json.dumps(
                {
                    "exit_code": report["exit_code"],
                    "error_tail": report["error_tail"],
                    **({"failure": report["failure"]} if report.get("failure") else {}),
                }
            ).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"RunToken {control['token']}",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=timeout):  # noqa: S310
            return True
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return False


def error_tail(log_path: Path) -> str:
    """The last lines of the driver's output, where a Python or Java error ends up."""
    try:
        with open(log_path, errors="replace") as f:
            return "".join(deque(f, maxlen=TAIL_LINES))
    except OSError:
        return ""


if __name__ == "__main__":
    os.umask(0o077)
    sys.exit(main(sys.argv[1:]))
