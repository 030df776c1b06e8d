"""The Spark driver program of a pipeline run: `spark-submit jobs/run.py RUN_DIR`.

RUN_DIR holds `run.json` (written by the control plane, mode 0600). The query runs until it
fails or a stop is requested by creating RUN_DIR/stop; a stop is graceful: the batch in
flight is finished (and committed) before the query stops.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

# spark-submit runs this file as a script: make the project importable, and take this
# directory off the path, or `import kafka` would find jobs/kafka instead of kafka-python.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from jobs.kafka import group_commit  # noqa: E402
from jobs.pipeline import RunConfig, start_query  # noqa: E402
from jobs.reporting import Reporter, progress_listener  # noqa: E402

log = logging.getLogger("jobs.run")

STOP_FILE = "stop"
POLL_SECONDS = 0.5


def wait(query, run_dir: Path) -> None:
    """Block until the query ends by itself, or stop it gracefully when asked to."""
    stop_file = run_dir / STOP_FILE
    while query.isActive:
        if stop_file.exists():
            log.info("stop requested: finishing the batch in flight")
            while query.isActive and query.status.get("isTriggerActive"):
                time.sleep(0.05)
            query.stop()
            return
        query.awaitTermination(POLL_SECONDS)
    if query.exception() is not None:
        raise query.exception()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if len(argv) != 1:
        print("usage: spark-submit jobs/run.py RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    config = RunConfig.load(run_dir / "run.json")
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"pipeline:{config.pipeline}").getOrCreate()
    reporter = start_reporter(config.control_plane, run_dir)
    if reporter is not None:
        spark.streams.addListener(progress_listener(reporter))
    mirror = None
    if config.spec.source.consumer_group:
        mirror = group_commit.attach(
            spark, config.kafka, config.spec.source.consumer_group, config.pipeline
        )
    query = start_query(spark, config)
    log.info("query %s started (checkpoint %s)", query.id, config.checkpoint)
    try:
        wait(query, run_dir)
    finally:
        if reporter is not None:
            reporter.close()
        if mirror is not None:
            mirror.close()
        spark.stop()
    return 0


def start_reporter(cp: dict | None, run_dir: Path) -> Reporter | None:
    """Heartbeats and progress to the control plane, if run.json says where it is."""
    if not cp:
        return None

    def stop(reason: str) -> None:
        log.info("%s: stopping after the batch in flight", reason)
        (run_dir / STOP_FILE).touch()

    return Reporter(
        cp["url"],
        cp["run_id"],
        cp["token"],
        heartbeat_seconds=cp.get("heartbeat_seconds", 5.0),
        on_stop=stop,
    ).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
