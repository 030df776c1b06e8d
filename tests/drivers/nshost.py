#!/usr/bin/env python3
"""The first process of a PID namespace standing in for a control-plane host
(tests/test_two_hosts.py): `unshare --pid --fork --mount-proc python nshost.py SPEC.json`.

SPEC.json: {"name": {"command": [...], "log": "path"}, ...}. Starts each command in a
process group of its own, reaps every process of the namespace that ends (as an init must:
detached drivers are re-parented here), and on SIGTERM passes it on to every group. When this
process ends, the kernel kills everything left in the namespace: the host is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    children = []
    for entry in spec.values():
        log = open(entry["log"], "ab")  # noqa: SIM115 - the child keeps it
        children.append(
            subprocess.Popen(
                entry["command"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    stopping = {"at": None}

    def terminate(signum, frame) -> None:
        stopping["at"] = time.monotonic()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminate)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        if stopping["at"] is not None and (
            all(c.poll() is not None for c in children) or time.monotonic() - stopping["at"] > 20
        ):
            return 0
        time.sleep(0.2)


if __name__ == "__main__":
    sys.exit(main())
