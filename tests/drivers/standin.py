#!/usr/bin/env python3
"""A stand-in for spark-submit in supervision tests: a real process under the real supervisor,
whose behaviour the test picks (SPARK_SUBMIT points here). Spark is not started, so the
restart state machine can be driven through many runs in seconds.

    STANDIN_MODE=crash      print STANDIN_ERROR to stderr and exit 1 at once
    STANDIN_MODE=silent     send no heartbeat; run until killed, or until asked to stop
                            (RUN_DIR/stop, as jobs/run.py): then exit 0
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def main() -> int:
    mode = os.environ.get("STANDIN_MODE", "crash")
    if mode == "silent":
        stop = Path(sys.argv[-1]) / "stop"  # spark-submit ... jobs/run.py RUN_DIR
        while not stop.exists():
            time.sleep(0.1)
        return 0
    print(
        os.environ.get("STANDIN_ERROR", "java.lang.OutOfMemoryError: Java heap space"),
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
