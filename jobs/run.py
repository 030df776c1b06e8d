"""The Spark driver program of a dedicated pipeline run: `spark-submit jobs/run.py RUN_DIR`.

RUN_DIR holds `run.json` (written by the control plane, mode 0600). The query runs until it
fails or a stop is requested by creating RUN_DIR/stop; a stop is graceful: the batch in
flight is finished (and committed) before the query stops. RUN_DIR/kill stops it at once (the
batch in flight is abandoned; it is written again, exactly once, by the next run).

`serve` is one run's whole life in a Spark session; a shared application (`jobs/host.py`)
calls it once per member, each in a session and thread of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# spark-submit runs this file as a script: make the project importable, and take this
# directory off the path, or `import kafka` would find jobs/kafka instead of kafka-python.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from jobs import failures, hadoop  # noqa: E402
from jobs.kafka import group_commit  # noqa: E402
from jobs.pipeline import start_query  # noqa: E402
from jobs.reporting import ProgressPoller, Reporter, SharedChannel  # noqa: E402
from jobs.runconfig import RunConfig  # noqa: E402
from jobs.sinks.files import store as files  # noqa: E402
from jobs.stateful import source_reads  # noqa: E402
from jobs.supervise import write_json  # noqa: E402

log = logging.getLogger("jobs.run")

STOP_FILE = "stop"
KILL_FILE = "kill"
POLL_SECONDS = 0.5


def wait(query, run_dir: Path, poller: ProgressPoller | None = None) -> None:
    """Block until the query ends by itself, or stop it when asked to: gracefully (RUN_DIR/stop)
    or at once (RUN_DIR/kill), reading its progress (`poller`) meanwhile and once more at its
    end. Returns only once the query is no longer active."""
    try:
        _wait(query, run_dir, poller)
    finally:
        if poller is not None:
            poller.poll()


def _wait(query, run_dir: Path, poller: ProgressPoller | None) -> None:
    stop_file, kill_file = run_dir / STOP_FILE, run_dir / KILL_FILE
    while query.isActive:
        if poller is not None:
            poller.poll()
        if kill_file.exists():
            log.info("kill requested: stopping the query now")
            _stop(query)
            return
        if stop_file.exists():
            log.info("stop requested: finishing the batch in flight")
            while query.isActive and query.status.get("isTriggerActive"):
                if kill_file.exists():
                    break
                time.sleep(0.05)
            _stop(query)
            return
        query.awaitTermination(POLL_SECONDS)
    if query.exception() is not None:
        raise query.exception()


def _stop(query) -> None:
    """Stop the query; if Spark gives up waiting for it (spark.sql.streaming.stopTimeout),
    keep waiting: its end may be reported only once it can write nothing more."""
    try:
        query.stop()
    except Exception as exc:  # py4j's TimeoutException: the batch in flight does not give way
        log.warning("the query did not stop in time (%s); still waiting for it", exc)
    while query.isActive:
        time.sleep(POLL_SECONDS)


def serve(spark, run_dir: Path, config: RunConfig, channel: SharedChannel | None = None) -> None:
    """Run one pipeline's query in `spark` until it ends (raises if it failed), its progress
    read by this thread and handed to its reporter and consumer-group mirror (a shared
    application's members report through its `channel`)."""
    reporter = start_reporter(config.control_plane, run_dir, channel)
    mirror = None
    if config.spec.source.consumer_group:
        mirror = group_commit.GroupCommitter(config.kafka, config.spec.source.consumer_group)
    try:
        if (run_dir / STOP_FILE).exists() or (run_dir / KILL_FILE).exists():
            log.info("pipeline %s: asked to stop before its query started", config.pipeline)
            return
        query = start_query(spark, config)
        log.info("query %s started (checkpoint %s)", query.id, config.checkpoint)
        callbacks = []
        if reporter is not None:
            callbacks.append(reporter.progress)
        if mirror is not None:
            callbacks.append(group_commit.mirror(mirror, config.pipeline))
        on_idle = reporter.idle if reporter is not None else None
        reads = source_reads(config.spec)
        wait(query, run_dir, ProgressPoller(query, callbacks, on_idle, source_reads=reads))
    finally:
        files.stop_rollers(config.pipeline)
        if reporter is not None:
            reporter.close()
        if mirror is not None:
            mirror.close()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if len(argv) != 1:
        print("usage: spark-submit jobs/run.py RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    with judged(run_dir):  # a run.json that no longer parses (SpecError) is a verdict too
        config = RunConfig.load(run_dir / "run.json")
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.appName(f"pipeline:{config.pipeline}")
            # Checkpoints and files sinks on HDFS or S3 (run.json's "storage", if any).
            .config(map=hadoop.load(run_dir / "run.json"))
            .getOrCreate()
        )
        # Where its Spark UI listens (the control plane's pages link to it); none without one.
        write_json(run_dir / UI_FILE, {"url": spark.sparkContext.uiWebUrl})
        try:
            # Judged before the session stops: a Java exception's causes are read through it.
            with judged(run_dir, config.pipeline, config):
                serve(spark, run_dir, config)
        finally:
            spark.stop()
    return 0


def judge(
    exc: BaseException, pipeline: str | None = None, config: RunConfig | None = None
) -> dict | None:
    """The verdict on the exception a run failed with (jobs.failures: by its type), as its
    exit report carries it; None if there is none to give. A missing topic is named (Kafka's
    own error does not say which): the source's topics are looked up in its cluster, given
    the run's `config`. Never raises: the failure itself must still be reported, whatever
    happens here."""
    try:
        verdict = failures.classify(
            exc,
            batch_error=failures.raised_in_batch(pipeline),
            stores=failures.stores_of(pipeline),
        )
    except Exception:
        log.exception("the failure could not be classified")
        return None
    if verdict is None:
        return None
    if verdict.category == failures.MISSING_TOPIC and config is not None:
        verdict = _naming_topics(verdict, config)
    return verdict.as_dict()


def _naming_topics(verdict: failures.Verdict, config: RunConfig) -> failures.Verdict:
    """The verdict on a missing topic, naming the source's topics its cluster does not
    have (asked once, within the client's request timeout); as it was if none is missing
    there (a sink's topic: its own check names it) or the cluster cannot be asked."""
    from .kafka.source import metadata_consumer

    topics = list(config.spec.source.topics) if config.spec.source is not None else []
    if not topics:
        return verdict
    try:
        consumer = metadata_consumer({**config.kafka, "request_timeout_ms": 5000})
        try:
            existing = consumer.topics()
        finally:
            consumer.close()
    except Exception as exc:  # the cluster cannot say: the verdict stays as it is
        log.warning("the source's topics could not be looked up: %s", exc)
        return verdict
    missing = [t for t in topics if t not in existing]
    if not missing:
        return verdict
    names = ", ".join(repr(t) for t in missing)
    which = "topic" if len(missing) == 1 else "topics"
    reason = failures.clip(
        f"{failures.NO_TOPIC}: the source's {which} {names} not found on its Kafka cluster"
        f" ({verdict.reason.removeprefix(failures.NO_TOPIC + ': ')})",
        failures.MAX_REASON,
    )
    return dataclasses.replace(verdict, reason=reason)


@contextlib.contextmanager
def judged(
    run_dir: Path, pipeline: str | None = None, config: RunConfig | None = None
) -> Iterator[None]:
    """On an exception leaving the block: write its verdict (RUN_DIR/failure.json, which
    the supervisor adds to its exit report), then let it go on."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, JUDGED, False):
            raise  # by an inner block, nearer the failure (the JVM may be gone by now)
        with contextlib.suppress(AttributeError):
            setattr(exc, JUDGED, True)
        verdict = judge(exc, pipeline, config)
        if verdict is not None:
            try:
                failures.write_verdict(run_dir, failures.Verdict(**verdict))
            except OSError:
                log.exception("the failure's verdict could not be written")
        raise


JUDGED = "_controlplane_judged"
UI_FILE = "ui.json"


def start_reporter(
    cp: dict | None, run_dir: Path, channel: SharedChannel | None = None
) -> Reporter | None:
    """Heartbeats and progress to the control plane, if run.json says where it is."""
    if not cp:
        return None

    def stop(reason: str) -> None:
        log.info("%s: stopping after the batch in flight", reason)
        (run_dir / STOP_FILE).touch()

    def refused(reason: str) -> None:
        # Another run may own the pipeline now (this host was lost, its runs ended): stop at
        # once, never "after the batch in flight", which under a backlog is batch after
        # batch. The batch interrupted is replayed by the current run; the sinks' commit
        # markers keep its rows once.
        log.warning("%s: stopping the query now", reason)
        (run_dir / KILL_FILE).touch()

    return Reporter(
        cp["url"],
        cp["run_id"],
        cp["token"],
        heartbeat_seconds=cp.get("heartbeat_seconds", 5.0),
        on_stop=stop,
        on_refused=refused,
        channel=channel,
    ).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
