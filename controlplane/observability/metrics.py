"""A pipeline's live figures: checkpoint progress, Kafka lag, backpressure, throughput.

Committed offsets come from the checkpoint directory itself when the control plane can read
it (the truth, even while the driver is dead), else from the last progress the driver
reported. Log ends come from the broker (confirmed by a fetch's high watermark), so lag is
exact, and known while the job is stopped. Time lag is the age of the oldest record not yet
processed. The lag's status and the backpressure level come from recent progress reports
(`controlplane.observability.lag` has the rules).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Min

from controlplane.connections.masking import mask
from controlplane.definitions.models import (
    BatchProgress,
    DesiredState,
    Pipeline,
    ProgressRollup,
    RunState,
)
from controlplane.observability.checkpoints import Checkpoint, read_checkpoint
from controlplane.observability.lag import Batch, Sample, backpressure, lag_status, partition_lags
from jobs.connections import kafka_client_config
from jobs.kafka.offsets import flatten

from . import kafka_lookups
from .kafka_lookups import KafkaLookups

log = logging.getLogger("controlplane.metrics")


def checkpoint_of(pipeline: Pipeline) -> Checkpoint | None:
    return read_checkpoint(Path(settings.CONTROLPLANE_CHECKPOINT_ROOT) / pipeline.name)


def window_seconds(pipeline: Pipeline) -> float:
    return max(60.0, 10 * pipeline.trigger_seconds)


def pipeline_metrics(
    pipeline: Pipeline, now: datetime, lookups: KafkaLookups | None = None
) -> dict:
    checkpoint = checkpoint_of(pipeline)
    recent = _recent_progress(pipeline, now)
    if checkpoint is not None and checkpoint.last_committed is not None:
        committed = checkpoint.committed_offsets()
        last = checkpoint.last_committed
        checkpoint_part = {
            "source": "checkpoint",
            "last_batch_id": last.batch_id,
            "last_commit_at": _iso(last.committed_at),
            "age_seconds": _age(now, last.committed_at),
            "committed_offsets": last.offsets,
            "in_flight": checkpoint.in_flight,
        }
    else:
        committed, checkpoint_part = _reported_checkpoint(pipeline, now)
    running = (
        pipeline.desired_state == DesiredState.RUNNING
        and pipeline.runs.filter(state=RunState.RUNNING).exists()
    )
    lag = _kafka_lag(pipeline, committed, now, lookups)
    status = lag_status(
        [_sample(p) for p in recent if p.end_offsets and p.latest_offsets],
        running=running,
        now=now,
        window=window_seconds(pipeline),
    )
    lag.update(status.as_dict())
    source = pipeline.spec.get("source", {})
    # A run's first batch pays for Python worker start-up and JIT warm-up: not backpressure.
    firsts = _first_batches(recent)
    steady = [p for p in recent if p.batch_id != firsts.get(p.run_id)]
    pressure = backpressure(
        [Batch(p.batch_duration_ms or 0, p.num_input_rows) for p in steady[-10:]],
        trigger_seconds=pipeline.trigger_seconds,
        max_records_per_batch=source.get("max_records_per_batch"),
        lag_growing=status.status == "lagging",
    )
    with_data = [p for p in recent if p.num_input_rows]
    return {
        "status": pipeline.status,
        "checkpoint": checkpoint_part,
        "lag": lag,
        "backpressure": pressure.as_dict() if running else {**pressure.as_dict(), "level": "ok"},
        "throughput": {
            "input_rows_per_second": _mean(p.input_rows_per_second for p in with_data),
            "processed_rows_per_second": _mean(p.processed_rows_per_second for p in with_data),
        },
    }


def checkpoint_page(pipeline: Pipeline) -> dict | None:
    """The checkpoint as it is on disk where the control plane can read it, else as the
    drivers reported it; with the stateful operators' rows and memory and the watermark
    from progress reports. None if there is neither."""
    checkpoint = checkpoint_of(pipeline)
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


RECENT_BATCHES = 600  # enough for the lag trend of a window even with back-to-back batches


def _recent_progress(pipeline: Pipeline, now: datetime) -> list[BatchProgress]:
    """The window's progress, oldest first: at most its newest RECENT_BATCHES batches."""
    since = now - timedelta(seconds=window_seconds(pipeline))
    rows = BatchProgress.objects.filter(run__pipeline=pipeline, reported_at__gte=since)
    newest = list(rows.order_by("-reported_at", "-id")[:RECENT_BATCHES])
    newest.reverse()
    return newest


def _first_batches(rows: list[BatchProgress]) -> dict[int, int]:
    """The first batch each of these rows' runs reported."""
    runs = {p.run_id for p in rows}
    firsts = (
        BatchProgress.objects.filter(run_id__in=runs)
        .values("run_id")
        .annotate(first=Min("batch_id"))
    )
    return {row["run_id"]: row["first"] for row in firsts}


def _sample(progress: BatchProgress) -> Sample:
    end = _flat(progress.end_offsets)
    latest = _flat(progress.latest_offsets)
    lag = sum(max(0, latest.get(tp, o) - o) for tp, o in end.items())
    return Sample(at=progress.reported_at, lag=lag, committed=sum(end.values()))


def _reported_checkpoint(pipeline: Pipeline, now: datetime) -> tuple[dict, dict]:
    """Where the checkpoint cannot be read: the last batch a driver reported."""
    last = BatchProgress.objects.filter(run__pipeline=pipeline).order_by("-reported_at").first()
    if last is None:
        return {}, {
            "source": None,
            "last_batch_id": None,
            "last_commit_at": None,
            "age_seconds": None,
            "committed_offsets": {},
            "in_flight": [],
        }
    return _flat(last.end_offsets), {
        "source": "progress",
        "last_batch_id": last.batch_id,
        "last_commit_at": _iso(last.reported_at),
        "age_seconds": _age(now, last.reported_at),
        "committed_offsets": last.end_offsets or {},
        "in_flight": [],
    }


def _kafka_lag(
    pipeline: Pipeline, committed: dict, now: datetime, lookups: KafkaLookups | None = None
) -> dict:
    from kafka import TopicPartition

    lookups = lookups or KafkaLookups()
    source = pipeline.spec["source"]
    out = {"records": None, "seconds": None, "partitions": [], "error": None}
    try:
        connection = pipeline.connections.get(name=source["connection"])
        config = {
            **kafka_client_config(connection.settings, connection.get_secrets()),
            # An API answer must not hang on a dead cluster.
            "bootstrap_timeout_ms": 3_000,
            "request_timeout_ms": 5_000,
            # Pooled consumers: see added partitions within seconds, not minutes.
            "metadata_max_age_ms": 10_000,
        }
        consumer = kafka_lookups.acquire(config)
    except Exception as exc:  # an unreachable cluster is a figure we cannot give, not a 500
        log.warning("pipeline %s: no Kafka lag: %s", pipeline.name, exc)
        return {**out, "error": mask(f"cannot reach Kafka: {exc}")}
    healthy = False
    try:
        partitions = [
            (topic, p)
            for topic in source["topics"]
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            healthy = True
            return {**out, "error": "the topics have no partitions (do they exist?)"}
        earliest, ends = lookups.bounds(config, consumer, partitions)
        lags = partition_lags(committed, ends, earliest)
        oldest = None
        for lag in lags:
            if lag.lag > 0:
                position = lag.committed
                if position is None:
                    position = earliest[(lag.topic, lag.partition)]
                found = lookups.record_time(
                    config, consumer, TopicPartition(lag.topic, lag.partition), position, lag.end
                )
                if found is not None and (oldest is None or found[1] < oldest):
                    oldest = found[1]
        seconds = 0.0
        if oldest is not None:
            seconds = max(0.0, now.timestamp() - oldest / 1000)
        healthy = True
        return {
            "records": sum(lag.lag for lag in lags),
            "seconds": seconds,
            "partitions": [lag.as_dict() for lag in lags],
            "error": None,
        }
    except Exception as exc:
        log.warning("pipeline %s: no Kafka lag: %s", pipeline.name, exc)
        return {**out, "error": mask(f"cannot read offsets from Kafka: {exc}")}
    finally:
        kafka_lookups.release(config, consumer, healthy=healthy)


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
