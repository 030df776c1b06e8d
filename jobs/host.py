"""The driver program of a shared Spark application: `spark-submit jobs/host.py APP_DIR`.

One long-lived Spark application hosts the queries of many pipelines. The control plane
assigns a run to it by writing APP_DIR/queue/<name>.json (`{"run_dir": ...}`, atomically);
the host claims it (renames it to `.taken`; the control plane cancels an assignment not yet
claimed the same way) within a fraction of a second and runs it as a dedicated driver would
(`jobs.run.serve`): from the run's own directory and `run.json`, with its own token,
reporter (its reports sent with the other members' in one request: `SharedChannel`) and
checkpoint, in a Spark session of its own (its SQL settings and temporary
views are its own) and a FAIR scheduler pool named after the pipeline. Stopping (RUN_DIR/stop)
or killing (RUN_DIR/kill) one member touches no other.

When a member's query ends, the host writes RUN_DIR/exit.json (exit code 0 when it stopped
as asked, 1 when it failed, with the error and its verdict, permanent or transient:
jobs.failures) and reports it at once
(`POST /api/runs/{id}/exit/`, as the supervisor of a dedicated run does), then removes the
assignment. It writes the exit only once the query is no longer active: a query that does
not give way to a kill keeps its run open until the control plane recycles the application.

Everything goes through files in directories only this user can read, so members keep
running, and new ones queue up, while the control plane is down. APP_DIR/ready.json says the
Spark session is up; APP_DIR/stop stops every member gracefully, then the application.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import threading
import time
import traceback
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from jobs import hadoop  # noqa: E402
from jobs.reporting import SharedChannel  # noqa: E402
from jobs.run import STOP_FILE, judge, serve  # noqa: E402
from jobs.runconfig import RunConfig  # noqa: E402
from jobs.supervise import send_exit_report, write_json  # noqa: E402

log = logging.getLogger("jobs.host")

QUEUE = "queue"
TAKEN = ".taken"
READY = "ready.json"
POLL_SECONDS = 0.2
ERROR_TAIL_CHARS = 8000
MEMBER_PARTITIONS = 1


class Member(threading.Thread):
    """One assigned run, in its own Spark session and scheduler pool."""

    def __init__(self, spark, assignment: Path, run_dir: Path, channel=None):
        super().__init__(name=f"member:{run_dir.parent.name}/{run_dir.name}", daemon=True)
        self.spark = spark
        self.assignment = assignment
        self.run_dir = run_dir
        self.channel = channel

    def run(self) -> None:
        code, error, failure, pipeline, config = 0, "", None, None, None
        try:
            # A member's batches are not split over the application's task slots: the
            # members are the parallelism (RunConfig.default_partitions).
            config = dataclasses.replace(
                RunConfig.load(self.run_dir / "run.json"), default_partitions=MEMBER_PARTITIONS
            )
            pipeline = config.pipeline
            session = self.spark.newSession()
            # Jobs of this thread (and of the query's stream thread, which inherits it) share
            # the driver's scheduler fairly with the other members.
            session.sparkContext.setLocalProperty("spark.scheduler.pool", config.pipeline)
            serve(session, self.run_dir, config, self.channel)
        except Exception as exc:  # the member's failure, never the application's
            if not jvm_alive(self.spark):
                # The application's JVM is gone: the query with it. That is the
                # application's loss, which its supervisor reports; not this member's failure.
                log.error("member %s: the application's JVM is gone", self.run_dir)
                return
            code = 1
            error = "".join(traceback.format_exception(exc))[-ERROR_TAIL_CHARS:]
            # Permanent or not, by the exception's type (jobs.failures), while the JVM that
            # holds a Java exception's causes is up.
            failure = judge(exc, pipeline, config)
            log.error("member %s failed: %s", self.run_dir, str(exc)[:500])
        report = {"exit_code": code, "ended_at": time.time(), "error_tail": error}
        if failure is not None:
            report["failure"] = failure
        write_json(self.run_dir / "exit.json", report)
        send_exit_report(self.run_dir, report)
        self.assignment.unlink(missing_ok=True)


def jvm_alive(spark) -> bool:
    try:
        spark.sparkContext._jvm.java.lang.System.currentTimeMillis()
    except Exception:  # py4j cannot reach the JVM
        return False
    return True


def assignments(app_dir: Path) -> list[tuple[Path, Path]]:
    """The queued assignments: (assignment file, run directory), oldest first."""
    found = []
    for path in sorted((app_dir / QUEUE).glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            found.append((path, Path(json.loads(path.read_text())["run_dir"])))
        except (OSError, ValueError, KeyError):
            continue  # removed meanwhile, or not written through yet (writes are atomic)
    return found


def channel(app_dir: Path) -> SharedChannel | None:
    """The application's one connection for its members' reports (app.json says where)."""
    try:
        cp = json.loads((app_dir / "app.json").read_text()).get("control_plane") or {}
    except (OSError, ValueError):
        return None
    if not cp.get("reports_url") or not cp.get("token"):
        return None
    return SharedChannel(cp["reports_url"], cp["token"])


def host(spark, app_dir: Path) -> None:
    """Run every assigned member until APP_DIR/stop; then stop them all gracefully."""
    members: dict[Path, Member] = {}
    reports = channel(app_dir)
    # Ready, and where its Spark UI listens (the control plane's pages link to it).
    write_json(app_dir / READY, {"ready_at": time.time(), "ui_url": spark.sparkContext.uiWebUrl})
    while not (app_dir / STOP_FILE).exists():
        for assignment, run_dir in assignments(app_dir):
            # Claimed by renaming it: the control plane cancels an assignment the same way,
            # so exactly one of the two gets it.
            taken = assignment.with_name(assignment.name + TAKEN)
            try:
                assignment.rename(taken)
            except FileNotFoundError:
                continue
            if run_dir in members or (run_dir / "exit.json").exists():
                taken.unlink(missing_ok=True)
                continue
            member = members[run_dir] = Member(spark, taken, run_dir, reports)
            member.start()
            log.info("member %s started", run_dir)
        for run_dir in [r for r, m in members.items() if not m.is_alive()]:
            del members[run_dir]
        time.sleep(POLL_SECONDS)
    log.info("application stop requested: stopping %d members gracefully", len(members))
    for run_dir in members:
        (run_dir / STOP_FILE).touch()
    for member in members.values():
        member.join()
    if reports is not None:
        reports.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if len(argv) != 1:
        print("usage: spark-submit jobs/host.py APP_DIR", file=sys.stderr)
        return 2
    app_dir = Path(argv[0])
    (app_dir / QUEUE).mkdir(mode=0o700, exist_ok=True)
    from pyspark.sql import SparkSession

    # Its members' checkpoints and files sinks on HDFS or S3 (app.json's "storage", if any).
    spark = SparkSession.builder.config(map=hadoop.load(app_dir / "app.json")).getOrCreate()
    try:
        host(spark, app_dir)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
