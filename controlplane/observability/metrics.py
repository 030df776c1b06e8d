"""A pipeline's figures: checkpoint progress, Kafka lag, backpressure, throughput.

Computed for many pipelines at once (`compute`) by the metrics collector
(`controlplane.observability.collector`), which stores them; the overview, the pipeline page,
the API and Prometheus read what it stored (`stored`), never Kafka or checkpoints per request.

Committed offsets come from the checkpoint directory itself when the control plane can read
it (the truth, even while the driver is dead), else from the last progress the driver
reported. Before a pipeline's first commit its lag counts from where it starts reading
(`start_offsets`), not from the topic's beginning. Log ends come from the broker (confirmed
by a fetch's high watermark), one lookup per cluster for all its pipelines' partitions, so lag
is exact, and known while the job is stopped. Time lag is the age of the oldest record not
yet processed. The lag's status comes from the collector's lag samples over the window, the
backpressure level from the recent progress reports (`controlplane.observability.lag` has the
rules).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import F, Min, Window
from django.db.models.functions import RowNumber
from django.utils.dateparse import parse_datetime

from controlplane.connections.masking import mask
from controlplane.definitions import checkpoints
from controlplane.definitions.models import (
    BatchProgress,
    Connection,
    DesiredState,
    LagSample,
    Pipeline,
    PipelineFigures,
    ProgressRollup,
    Run,
    RunState,
)
from controlplane.observability.lag import (
    Batch,
    Sample,
    backpressure,
    lag_status,
    partition_lags,
    time_until_loss,
)
from jobs.kafka.offsets import flatten
from jobs.spec.model import starting_timestamp_ms
from jobs.storage import StorageError

from . import kafka_lookups
from .kafka_lookups import KafkaLookups

log = logging.getLogger("controlplane.metrics")


def checkpoint_of(pipeline: Pipeline, *, history: int = 20, sizes: bool = True):
    """The pipeline's checkpoint as its store has it; None before its first batch, or while
    the store cannot be reached (HDFS or S3 down: the reported progress stands in)."""
    try:
        return checkpoints.read(pipeline, history=history, sizes=sizes)
    except StorageError as exc:
        log.warning("checkpoint of %s not read: %s", pipeline.name, exc)
        return None


def window_seconds(pipeline: Pipeline) -> float:
    return max(60.0, 10 * pipeline.trigger_seconds)


# Recent batches per pipeline for backpressure and throughput: the last 10 steady ones (and
# the run's first, which is left out).
RECENT_BATCHES = 11


@dataclass
class Computed:
    """One pipeline's figures, and what the collector keeps beside them."""

    figures: dict
    start_offsets: dict | None = None
    committed_sum: int | None = None


def compute(
    pipelines: list[Pipeline],
    now: datetime,
    lookups: KafkaLookups | None = None,
    *,
    starts: dict[int, dict] | None = None,
) -> dict[int, Computed]:
    """The figures of `pipelines` now, asked in bulk: a few queries for all of them, each
    pipeline's checkpoint read once, and one log-bounds lookup per Kafka cluster. `starts`:
    each pipeline's start offsets as stored by an earlier round (pipelines that have not
    committed yet)."""
    lookups = lookups or KafkaLookups()
    starts = starts or {}
    ids = [p.pk for p in pipelines]
    running = set(
        Run.objects.filter(pipeline_id__in=ids, state=RunState.RUNNING).values_list(
            "pipeline_id", flat=True
        )
    )
    recent = _recent_batches(pipelines, now)
    samples = _lag_samples(pipelines, now)
    positions: dict[int, tuple[dict, dict]] = {}
    missing = []
    for pipeline in pipelines:
        checkpoint = checkpoint_of(pipeline, history=1, sizes=False)
        if checkpoint is not None and checkpoint.last_committed is not None:
            last = checkpoint.last_committed
            positions[pipeline.pk] = (
                checkpoint.committed_offsets(),
                {
                    "source": "checkpoint",
                    "last_batch_id": last.batch_id,
                    "last_commit_at": _iso(last.committed_at),
                    "age_seconds": _age(now, last.committed_at),
                    "committed_offsets": last.offsets,
                    "in_flight": checkpoint.in_flight,
                },
            )
        else:
            missing.append(pipeline)
    positions.update(_reported_checkpoints(missing, now))
    lags = _kafka_lags(pipelines, positions, now, lookups, starts)
    out = {}
    for pipeline in pipelines:
        committed, checkpoint_part = positions[pipeline.pk]
        lag, start = lags[pipeline.pk]
        is_running = pipeline.desired_state == DesiredState.RUNNING and pipeline.pk in running
        committed_sum = sum(committed.values()) if committed else 0
        series = list(samples.get(pipeline.pk, []))
        if lag["records"] is not None:
            series.append(Sample(at=now, lag=lag["records"], committed=committed_sum))
        rows = recent.get(pipeline.pk, [])
        source = pipeline.spec.get("source", {})
        # A run's first batch pays for Python worker start-up and JIT warm-up: not backpressure.
        steady = [p for p in rows if not p["first"]]
        status = lag_status(
            series,
            running=is_running,
            now=now,
            window=window_seconds(pipeline),
            noise=_sawtooth(steady, pipeline.trigger_seconds),
        )
        lag.update(status.as_dict())
        pressure = backpressure(
            [Batch(p["batch_duration_ms"] or 0, p["num_input_rows"]) for p in steady[-10:]],
            trigger_seconds=pipeline.trigger_seconds,
            max_records_per_batch=source.get("max_records_per_batch"),
            lag_growing=status.status == "lagging",
        )
        with_data = [p for p in rows if p["num_input_rows"]]
        figures = {
            "status": pipeline.status,
            "checkpoint": checkpoint_part,
            "lag": lag,
            "backpressure": (
                pressure.as_dict() if is_running else {**pressure.as_dict(), "level": "ok"}
            ),
            "throughput": {
                "input_rows_per_second": _mean(p["input_rows_per_second"] for p in with_data),
                "processed_rows_per_second": _mean(
                    p["processed_rows_per_second"] for p in with_data
                ),
            },
        }
        out[pipeline.pk] = Computed(
            figures, start_offsets=start, committed_sum=committed_sum if committed else None
        )
    return out


def _sawtooth(batches: list[dict], trigger_seconds: float) -> float:
    """The most lag a job that keeps up shows between its commits: what arrives during a
    trigger interval and a batch (input rate x (trigger + mean batch duration))."""
    with_data = [b for b in batches if b["num_input_rows"]]
    rate = _mean(b["input_rows_per_second"] for b in with_data)
    if not rate:
        return 0.0
    duration = (_mean(b["batch_duration_ms"] for b in with_data) or 0) / 1000
    return rate * (max(trigger_seconds, 0.0) + duration)


def pipeline_metrics(
    pipeline: Pipeline, now: datetime, lookups: KafkaLookups | None = None
) -> dict:
    """One pipeline's figures computed now (what the collector stores for it)."""
    return compute([pipeline], now, lookups)[pipeline.pk].figures


LOOK_UP = object()  # stored(latest=...): not given, look it up


def latest_batches(pipeline_ids) -> dict[int, tuple[int, datetime]]:
    """The last batch each pipeline's active run reported, and when: newer than the
    collector's round, from the run's row (one query for all)."""
    rows = Run.objects.filter(
        pipeline_id__in=list(pipeline_ids), state__in=RunState.active(), last_batch_at__isnull=False
    ).values_list("pipeline_id", "last_batch_id", "last_batch_at")
    return {pipeline_id: (batch, at) for pipeline_id, batch, at in rows}


def stored(
    pipeline: Pipeline,
    now: datetime,
    row: PipelineFigures | None = None,
    latest: object = LOOK_UP,
) -> dict:
    """The figures the collector last stored for `pipeline`, with how fresh they are
    (`collected_at`, `age_seconds`); before its first round, empty figures that say so. The
    pipeline's status is always its current one, and the last committed batch the newer of
    the round's and the one its running driver reported since (`latest`, from
    `latest_batches`; looked up if not given)."""
    if latest is LOOK_UP:
        latest = latest_batches([pipeline.pk]).get(pipeline.pk)
    if row is None:
        row = PipelineFigures.objects.filter(pipeline=pipeline).first()
    if row is None:
        figures = empty_figures()
        collected = None
    else:
        figures = dict(row.figures)
        collected = row.collected_at
        checkpoint = dict(figures["checkpoint"])
        last = parse_datetime(checkpoint.get("last_commit_at") or "")
        if latest is not None and (last is None or latest[1] > last):
            checkpoint["last_batch_id"], last = latest
            checkpoint["last_commit_at"] = _iso(last)
        # The last commit's age now, not as of the round.
        checkpoint["age_seconds"] = _age(now, last)
        figures["checkpoint"] = checkpoint
    figures["status"] = pipeline.status
    figures["collected_at"] = _iso(collected)
    figures["age_seconds"] = _age(now, collected)
    return figures


def empty_figures() -> dict:
    return {
        "status": None,
        "checkpoint": _no_checkpoint(),
        "lag": {
            "records": None,
            "seconds": None,
            "partitions": [],
            "error": "not collected yet",
            "status": "ok",
            "trend": None,
            "eta_seconds": None,
        },
        "backpressure": {"level": "ok", "busy_ratio": None, "reason": "not collected yet"},
        "throughput": {"input_rows_per_second": None, "processed_rows_per_second": None},
    }


def checkpoint_page(pipeline: Pipeline) -> dict | None:
    """The checkpoint as it is on disk where the control plane can read it, else as the
    drivers reported it; with the stateful operators' rows and memory and the watermark
    from progress reports. None if there is neither."""
    unreachable = None
    try:
        checkpoint = checkpoints.read(pipeline)
    except StorageError as exc:
        checkpoint, unreachable = None, str(exc)
    reported = {
        p.batch_id: p
        for p in BatchProgress.objects.filter(run__pipeline=pipeline)
        .select_related("run")
        .order_by("-reported_at")[:CHECKPOINT_HISTORY]
    }
    if checkpoint is not None:
        page = {"source": "checkpoint", **checkpoint.as_dict()}
        for batch in page["history"]:
            progress = reported.get(batch["batch_id"])
            batch.update(_state(progress) if progress else _state(None))
    elif reported:
        newest = max(reported.values(), key=lambda p: p.reported_at)
        page = {
            "source": "progress",
            "path": None,
            "query_id": None,
            "reader": None,
            "last_batch_id": newest.batch_id,
            "last_commit_at": _iso(newest.reported_at),
            "committed_offsets": newest.end_offsets or {},
            "in_flight": [],
            "size_bytes": None,
            "state_size_bytes": None,
            "history": [
                {
                    "batch_id": p.batch_id,
                    "planned_at": _iso(p.timestamp),
                    "committed_at": _iso(p.reported_at),
                    "wal_to_commit_ms": (p.durations_ms or {}).get("walCommit"),
                    "offsets": p.end_offsets or {},
                    "watermark_ms": None,
                    **_state(p),
                }
                for p in sorted(reported.values(), key=lambda p: p.reported_at, reverse=True)
            ],
        }
    else:
        return None
    latest = next(
        (p for p in sorted(reported.values(), key=lambda p: p.reported_at, reverse=True)), None
    )
    page["state"] = _state(latest)
    # The store could not be read: what is shown is the drivers' reports, and why.
    page["unreachable"] = unreachable
    return page


CHECKPOINT_HISTORY = 20


def _state(progress: BatchProgress | None) -> dict:
    if progress is None:
        return {"state_rows": None, "state_memory_bytes": None, "watermark": None}
    return {
        "state_rows": progress.state_rows,
        "state_memory_bytes": progress.state_memory_bytes,
        "watermark": _iso(progress.watermark),
    }


HISTORY_POINTS = 2_000


def history(pipeline: Pipeline, since: datetime) -> list[dict]:
    """Figures since `since`, oldest first, for charts: one point per batch where raw
    progress is kept (`"resolution": "batch"`, the newest HISTORY_POINTS), and before that
    one per hourly roll-up (`"resolution": "hour"`: means over the hour's batches, the
    longest batch, the rows)."""
    raw = list(
        BatchProgress.objects.filter(run__pipeline=pipeline, reported_at__gte=since)
        .select_related("run")
        .order_by("-reported_at")[:HISTORY_POINTS]
    )
    raw.reverse()
    raw_from = raw[0].reported_at if raw else None
    rollups = ProgressRollup.objects.filter(
        pipeline=pipeline, bucket_start__gt=since - timedelta(seconds=3600)
    )
    if raw_from is not None:
        rollups = rollups.filter(bucket_start__lt=raw_from)
    trigger_ms = pipeline.trigger_seconds * 1000
    points = [_rollup_point(r, trigger_ms) for r in rollups.order_by("bucket_start")]
    for p in raw:
        sample = _sample(p) if p.end_offsets and p.latest_offsets else None
        points.append(
            {
                "at": _iso(p.reported_at),
                "resolution": "batch",
                "run": p.run.generation,
                "batch_id": p.batch_id,
                "batches": 1,
                "input_rows": p.num_input_rows,
                "input_rows_per_second": p.input_rows_per_second,
                "processed_rows_per_second": p.processed_rows_per_second,
                "batch_duration_ms": p.batch_duration_ms,
                "max_batch_duration_ms": p.batch_duration_ms,
                "busy_ratio": (p.batch_duration_ms or 0) / trigger_ms if trigger_ms else None,
                "lag_records": sample.lag if sample else None,
                "state_rows": p.state_rows,
            }
        )
    return points


def _rollup_point(r: ProgressRollup, trigger_ms: float) -> dict:
    n = r.batches or 1
    duration = r.sum_batch_duration_ms / n
    return {
        "at": _iso(r.bucket_start),
        "resolution": "hour",
        "run": None,
        "batch_id": None,
        "batches": r.batches,
        "input_rows": r.input_rows,
        "input_rows_per_second": r.sum_input_rows_per_second / n,
        "processed_rows_per_second": r.sum_processed_rows_per_second / n,
        "batch_duration_ms": duration,
        "max_batch_duration_ms": r.max_batch_duration_ms,
        "busy_ratio": duration / trigger_ms if trigger_ms else None,
        "lag_records": None,
        "state_rows": None,
    }


def _recent_batches(pipelines: list[Pipeline], now: datetime) -> dict[int, list[dict]]:
    """Each pipeline's newest RECENT_BATCHES batches within its window, oldest first, each
    marked `first` if it is its run's first batch. Two queries for all pipelines."""
    if not pipelines:
        return {}
    windows = {p.pk: window_seconds(p) for p in pipelines}
    since = now - timedelta(seconds=max(windows.values()))
    rows = list(
        BatchProgress.objects.filter(run__pipeline_id__in=list(windows), reported_at__gte=since)
        .annotate(
            pipeline_id=F("run__pipeline_id"),
            newest=Window(
                RowNumber(),
                partition_by=[F("run__pipeline_id")],
                order_by=[F("reported_at").desc(), F("id").desc()],
            ),
        )
        .filter(newest__lte=RECENT_BATCHES)
        .values(
            "pipeline_id",
            "run_id",
            "batch_id",
            "reported_at",
            "num_input_rows",
            "input_rows_per_second",
            "processed_rows_per_second",
            "batch_duration_ms",
        )
    )
    firsts = dict(
        BatchProgress.objects.filter(run_id__in={r["run_id"] for r in rows})
        .values("run_id")
        .annotate(first=Min("batch_id"))
        .values_list("run_id", "first")
    )
    out: dict[int, list[dict]] = {}
    for row in rows:
        if (now - row["reported_at"]).total_seconds() > windows[row["pipeline_id"]]:
            continue
        row["first"] = row["batch_id"] == firsts.get(row["run_id"])
        out.setdefault(row["pipeline_id"], []).append(row)
    for batches in out.values():
        batches.sort(key=lambda r: r["reported_at"])
    return out


def _lag_samples(pipelines: list[Pipeline], now: datetime) -> dict[int, list[Sample]]:
    """The collector's lag samples within each pipeline's window."""
    if not pipelines:
        return {}
    windows = {p.pk: window_seconds(p) for p in pipelines}
    since = now - timedelta(seconds=max(windows.values()))
    out: dict[int, list[Sample]] = {}
    rows = LagSample.objects.filter(
        pipeline_id__in=list(windows), at__gte=since, at__lte=now, records__isnull=False
    ).values_list("pipeline_id", "at", "records", "committed")
    for pipeline_id, at, records, committed in rows:
        out.setdefault(pipeline_id, []).append(Sample(at=at, lag=records, committed=committed or 0))
    return out


def _sample(progress: BatchProgress) -> Sample:
    end = _flat(progress.end_offsets)
    latest = _flat(progress.latest_offsets)
    lag = sum(max(0, latest.get(tp, o) - o) for tp, o in end.items())
    return Sample(at=progress.reported_at, lag=lag, committed=sum(end.values()))


def lag_history(pipeline: Pipeline, since: datetime) -> list[dict]:
    """The collector's lag samples since `since`, oldest first (also while the job was
    down): what the lag chart draws."""
    rows = LagSample.objects.filter(pipeline=pipeline, at__gte=since).order_by("at")
    return [
        {"at": _iso(at), "records": records, "seconds": seconds}
        for at, records, seconds in rows.values_list("at", "records", "seconds")[:HISTORY_POINTS]
    ]


def _no_checkpoint() -> dict:
    return {
        "source": None,
        "last_batch_id": None,
        "last_commit_at": None,
        "age_seconds": None,
        "committed_offsets": {},
        "in_flight": [],
    }


def _reported_checkpoints(pipelines: list[Pipeline], now: datetime) -> dict[int, tuple]:
    """Where the checkpoint cannot be read: the last batch each pipeline's drivers reported."""
    out = {p.pk: ({}, _no_checkpoint()) for p in pipelines}
    if not pipelines:
        return out
    last = (
        BatchProgress.objects.filter(run__pipeline_id__in=list(out))
        .annotate(pipeline_id=F("run__pipeline_id"))
        .order_by("run__pipeline_id", "-reported_at", "-id")
        .distinct("run__pipeline_id")
        .values("pipeline_id", "batch_id", "reported_at", "end_offsets")
    )
    for row in last:
        out[row["pipeline_id"]] = (
            _flat(row["end_offsets"]),
            {
                "source": "progress",
                "last_batch_id": row["batch_id"],
                "last_commit_at": _iso(row["reported_at"]),
                "age_seconds": _age(now, row["reported_at"]),
                "committed_offsets": row["end_offsets"] or {},
                "in_flight": [],
            },
        )
    return out


def _kafka_lags(
    pipelines: list[Pipeline],
    positions: dict[int, tuple[dict, dict]],
    now: datetime,
    lookups: KafkaLookups,
    starts: dict[int, dict],
) -> dict[int, tuple[dict, dict | None]]:
    """Each pipeline's lag, and its start offsets if it has committed nothing yet: one
    metadata consumer and one log-bounds lookup per Kafka connection for all its pipelines."""
    by_connection: dict[str, list[Pipeline]] = {}
    for pipeline in pipelines:
        by_connection.setdefault(pipeline.spec["source"]["connection"], []).append(pipeline)
    connections = {c.name: c for c in Connection.objects.filter(name__in=list(by_connection))}
    out = {}
    for name, members in by_connection.items():
        out.update(_cluster_lags(connections.get(name), members, positions, now, lookups, starts))
    return out


def _cluster_lags(connection, pipelines, positions, now, lookups, starts) -> dict:
    from kafka import TopicPartition

    empty = {"records": None, "seconds": None, "partitions": [], "error": None}
    if connection is None:
        error = "its Kafka connection does not exist"
        return {p.pk: ({**empty, "error": error}, None) for p in pipelines}
    try:
        config = kafka_lookups.lookup_config(connection)
        consumer = kafka_lookups.acquire(config)
    except Exception as exc:  # an unreachable cluster is a figure we cannot give
        log.warning("connection %s: no Kafka lag: %s", connection.name, exc)
        error = mask(f"cannot reach Kafka: {exc}")
        return {p.pk: ({**empty, "error": error}, None) for p in pipelines}
    healthy = False
    out = {}
    try:
        topics = sorted({t for p in pipelines for t in p.spec["source"]["topics"]})
        partitions_of = {t: sorted(consumer.partitions_for_topic(t) or ()) for t in topics}
        everything = sorted((t, n) for t in topics for n in partitions_of[t])
        earliest, ends = lookups.bounds(config, consumer, everything) if everything else ({}, {})
        retention = kafka_lookups.retention_ms(config, topics)
        healthy = True
        for pipeline in pipelines:
            source = pipeline.spec["source"]
            mine = [(t, n) for t in source["topics"] for n in partitions_of[t]]
            if not mine:
                out[pipeline.pk] = (
                    {**empty, "error": "the topics have no partitions (do they exist?)"},
                    None,
                )
                continue
            committed, _ = positions[pipeline.pk]
            start = None
            if not committed:
                start = _start_offsets(pipeline, mine, earliest, ends, consumer, starts)
            lags = partition_lags(committed or start or {}, {tp: ends[tp] for tp in mine}, earliest)
            oldest = None
            unread_since: dict[tuple[str, int], int] = {}
            for lag in lags:
                if lag.lag > 0:
                    position = lag.committed
                    if position is None:
                        position = earliest[(lag.topic, lag.partition)]
                    found = lookups.record_time(
                        config,
                        consumer,
                        TopicPartition(lag.topic, lag.partition),
                        position,
                        lag.end,
                    )
                    if found is not None:
                        unread_since[(lag.topic, lag.partition)] = found[1]
                    if found is not None and (oldest is None or found[1] < oldest):
                        oldest = found[1]
            seconds = 0.0 if oldest is None else max(0.0, now.timestamp() - oldest / 1000)
            out[pipeline.pk] = (
                {
                    "records": sum(lag.lag for lag in lags),
                    "seconds": seconds,
                    "partitions": [lag.as_dict() for lag in lags],
                    "error": None,
                    "from": "committed" if committed else "start",
                    "data_loss": time_until_loss(
                        unread_since, retention, int(now.timestamp() * 1000)
                    ),
                },
                start,
            )
        return out
    except Exception as exc:
        healthy = False
        log.warning("connection %s: no Kafka lag: %s", connection.name, exc)
        error = mask(f"cannot read offsets from Kafka: {exc}")
        return {p.pk: out.get(p.pk) or ({**empty, "error": error}, None) for p in pipelines}
    finally:
        kafka_lookups.release(config, consumer, healthy=healthy)


def _start_offsets(pipeline, partitions, earliest, ends, consumer, starts) -> dict:
    """Where a pipeline that has committed nothing starts reading, per partition: what its
    source wrote into the checkpoint when the query first started, else what an earlier
    round resolved, else its spec's `starting_offsets` resolved now. `latest` (and -1) is the
    log end: while the pipeline has never run that follows the log (its lag stays 0); once it
    has, the end first seen is kept (records after it are lag)."""
    try:
        written = checkpoints.start_offsets(pipeline)
    except StorageError:
        written = {}
    if written:
        return {tp: written.get(tp, earliest.get(tp, 0)) for tp in partitions}
    if pipeline.offsets_reset:  # an operator's reset: where the next run starts
        reset = flatten(pipeline.offsets_reset)
        return {tp: reset.get(tp, earliest.get(tp, 0)) for tp in partitions}
    known = flatten(starts.get(pipeline.pk) or {})
    if known and all(tp in known for tp in partitions):
        return {tp: known[tp] for tp in partitions}
    starting = pipeline.spec["source"].get("starting_offsets", "latest")
    out = {}
    at = starting_timestamp_ms(starting)
    if at is not None:
        from kafka import TopicPartition

        found = consumer.offsets_for_times({TopicPartition(t, n): at for t, n in partitions})
        for t, n in partitions:
            hit = found.get(TopicPartition(t, n))
            out[(t, n)] = hit.offset if hit is not None else ends[(t, n)]
        return out
    requested = flatten(starting) if isinstance(starting, dict) else {}
    for tp in partitions:
        if tp in known:
            out[tp] = known[tp]
            continue
        wanted = requested.get(tp, -2) if isinstance(starting, dict) else starting
        if wanted in ("earliest", -2):
            out[tp] = earliest[tp]
        elif wanted in ("latest", -1):
            out[tp] = ends[tp]
        else:
            out[tp] = min(max(int(wanted), earliest[tp]), ends[tp])
    return out


def _flat(offsets) -> dict[tuple[str, int], int]:
    """Reported offsets, flattened; a report without offsets has none."""
    return flatten(offsets) if isinstance(offsets, dict) else {}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _age(now: datetime, then: datetime | None) -> float | None:
    return (now - then).total_seconds() if then else None


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
