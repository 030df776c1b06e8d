"""The driver supervisor: detaching, exit reports, and killing the whole process tree."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from controlplane.definitions.models import Run
from controlplane.supervision import launcher
from tests.waiting import wait_for


def supervise(run_dir, *command: str) -> int:
    result = subprocess.run(
        [sys.executable, "-m", "jobs.supervise", "--detach", str(run_dir), "--", *command],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(result.stdout)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_the_exit_code_and_error_tail_are_reported_at_once(tmp_path):
    script = "import sys; print('about to fail'); sys.exit(3)"
    supervise(tmp_path, sys.executable, "-c", script)
    assert wait_for(lambda: (tmp_path / "exit.json").exists())
    report = json.loads((tmp_path / "exit.json").read_text())
    assert report["exit_code"] == 3
    assert "about to fail" in report["error_tail"]


def test_kill_ends_the_supervisor_and_everything_the_driver_started(tmp_path):
    # The "driver" starts a grandchild, as spark-submit starts a JVM and Python workers.
    script = "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"
    pid = supervise(tmp_path, sys.executable, "-c", script)
    assert wait_for(lambda: (tmp_path / "driver.json").exists())
    driver = json.loads((tmp_path / "driver.json").read_text())["pid"]
    assert wait_for(
        lambda: (
            subprocess.run(["pgrep", "-g", str(pid)], capture_output=True).stdout.count(b"\n") >= 3
        )
    )
    group = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True).stdout.split()
    run = Run(pid=pid, host=socket.gethostname(), run_dir=str(tmp_path))
    assert launcher.alive(run) is True
    launcher.kill(run)
    assert wait_for(lambda: not any(alive(int(p)) for p in group)), group
    assert not alive(driver)


def test_what_a_driver_that_died_hard_left_behind_is_killed(tmp_path):
    """The JVM killed with -9 leaves the Python driver program it started running, orphaned:
    the supervisor kills what remains of its process group once the driver is gone."""
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen(['sleep', '300']); print(child.pid, flush=True); "
        "time.sleep(300)"
    )
    supervise(tmp_path, sys.executable, "-c", script)
    log = tmp_path / "driver.log"  # created by the supervisor once it has started the driver
    assert wait_for(lambda: log.exists() and log.read_text().strip().isdigit())
    orphan = int((tmp_path / "driver.log").read_text())
    driver = json.loads((tmp_path / "driver.json").read_text())["pid"]
    os.kill(driver, signal.SIGKILL)
    assert wait_for(lambda: (tmp_path / "exit.json").exists())
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == -9
    assert wait_for(lambda: not alive(orphan))
