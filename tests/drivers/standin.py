#!/usr/bin/env python3
"""A stand-in for spark-submit in supervision tests: a real process under the real supervisor,
whose behaviour the test picks (SPARK_SUBMIT points here). Spark is not started, so the
restart state machine can be driven through many runs in seconds.

    STANDIN_MODE=crash      print STANDIN_ERROR to stderr and exit 1 at once (with
                            STANDIN_FAILURE, first write it as RUN_DIR/failure.json: the
                            verdict jobs/run.py writes on a failure, jobs.failures)
    STANDIN_MODE=silent     send no heartbeat; run until killed, or until asked to stop
                            (RUN_DIR/stop, as jobs/run.py): then exit 0

Started as `... jobs/host.py APP_DIR` it stands in for a shared application's driver (`host`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def host(app_dir: Path) -> int:
    """A shared application's driver (jobs/host.py APP_DIR), without Spark: it claims its
    assignments as the real one does, and a member ends (exit.json) when asked to stop or
    be killed, except the pipelines named in STANDIN_STUCK, whose queries never give way.
    APP_DIR/stop stops the others, and the host once none is left."""
    stuck = set(filter(None, os.environ.get("STANDIN_STUCK", "").split(",")))
    (app_dir / "ready.json").write_text(json.dumps({"ready_at": time.time()}))
    members: dict[Path, Path] = {}  # run dir -> claimed assignment
    while True:
        for assignment in sorted((app_dir / "queue").glob("*.json")):
            taken = assignment.with_name(assignment.name + ".taken")
            try:
                assignment.rename(taken)
            except FileNotFoundError:
                continue
            members[Path(json.loads(taken.read_text())["run_dir"])] = taken
        stopping = (app_dir / "stop").exists()
        for run_dir, taken in list(members.items()):
            asked = stopping or (run_dir / "stop").exists() or (run_dir / "kill").exists()
            if asked and run_dir.parent.name not in stuck:
                (run_dir / "exit.json").write_text(json.dumps({"exit_code": 0, "error_tail": ""}))
                taken.unlink()
                del members[run_dir]
        if stopping and not members:
            return 0
        time.sleep(0.05)


def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[-2].endswith("jobs/host.py"):
        return host(Path(sys.argv[-1]))
    mode = os.environ.get("STANDIN_MODE", "crash")
    if mode == "silent":
        stop = Path(sys.argv[-1]) / "stop"  # spark-submit ... jobs/run.py RUN_DIR
        while not stop.exists():
            time.sleep(0.1)
        return 0
    if os.environ.get("STANDIN_FAILURE"):
        (Path(sys.argv[-1]) / "failure.json").write_text(os.environ["STANDIN_FAILURE"])
    print(
        os.environ.get("STANDIN_ERROR", "java.lang.OutOfMemoryError: Java heap space"),
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
