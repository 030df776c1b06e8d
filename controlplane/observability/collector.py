"""The metrics collector: every CONTROLPLANE_COLLECT_SECONDS (a beat task), every pipeline's
figures computed in one round and stored.

One round asks each Kafka cluster once for the log bounds of every partition its pipelines
read, reads each pipeline's checkpoint once, and stores a lag sample per pipeline (records,
seconds, committed position: also while its job is down, so a stopped job's growing lag is
on the chart) and the pipeline's figures (`PipelineFigures`), which every page, the API and
Prometheus read; and samples the writer schemas of schema-registry sources' topics
(`writer_schemas`). Rounds never overlap (a PostgreSQL advisory lock: a second worker's round
is skipped); a pipeline that cannot be measured keeps its last figures, and its sample says
the lag is unknown.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from django.db import IntegrityError, connection, transaction
from django.utils.dateparse import parse_datetime

from controlplane.definitions.models import LagSample, Pipeline, PipelineFigures
from jobs.kafka.offsets import nest

from . import dead_letters, metrics, writer_schemas
from .kafka_lookups import KafkaLookups

log = logging.getLogger("controlplane.metrics")

# pg_try_advisory_lock key of the collector's round ("cpmetric" in ASCII, as a bigint).
ROUND_LOCK = 0x63706D6574726963


def collect(now: datetime) -> dict:
    """One round over every pipeline; its summary (or why it was skipped)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ROUND_LOCK])
        if not cursor.fetchone()[0]:
            return {"skipped": "another round is running"}
    try:
        return _round(now)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ROUND_LOCK])


def _round(now: datetime) -> dict:
    started = time.perf_counter()
    pipelines = list(Pipeline.objects.order_by("name"))
    starts = dict(
        PipelineFigures.objects.exclude(start_offsets=None).values_list(
            "pipeline_id", "start_offsets"
        )
    )
    lookups = KafkaLookups()
    computed = metrics.compute(pipelines, now, lookups, starts=starts)
    previous = dict(
        PipelineFigures.objects.exclude(dead_letters=None).values_list(
            "pipeline_id", "figures__dead_letters"
        )
    )
    letters = dead_letters.counts(pipelines)
    sampled_before = writer_schemas.stored_sampling([p.pk for p in pipelines])
    try:
        sampling = writer_schemas.sample(pipelines, computed, sampled_before, now)
    except Exception as exc:  # a figure we cannot give, not an error of the round
        log.warning("no writer-schema samples: %s", exc)
        sampling = sampled_before
    samples, rows = [], []
    unknown = 0
    for pipeline in pipelines:
        result = computed[pipeline.pk]
        lag = result.figures["lag"]
        if lag["records"] is None:
            unknown += 1
        samples.append(
            LagSample(
                pipeline=pipeline,
                at=now,
                records=lag["records"],
                seconds=lag["seconds"],
                committed=result.committed_sum,
            )
        )
        start = result.start_offsets if pipeline.generation > 0 else None
        # A sink database that did not answer: its last count stands (best-effort).
        counted = letters.get(pipeline.pk, previous.get(pipeline.pk))
        result.figures["dead_letters"] = counted
        sampled_at, sampled_to = (
            sampling[pipeline.pk].stored() if pipeline.pk in sampling else (None, None)
        )
        rows.append(
            PipelineFigures(
                pipeline=pipeline,
                collected_at=now,
                figures=result.figures,
                lag_records=lag["records"],
                lag_seconds=lag["seconds"],
                lag_status=lag.get("status") or "",
                lag_error=lag.get("error") or "",
                backpressure=result.figures["backpressure"]["level"],
                last_commit_at=parse_datetime(result.figures["checkpoint"]["last_commit_at"] or ""),
                data_loss_seconds=(lag.get("data_loss") or {}).get("seconds"),
                start_offsets=nest(start) if start else None,
                dead_letters=counted["count"] if counted else None,
                writers_sampled_at=sampled_at,
                writers_sampled_to=sampled_to,
            )
        )
    try:
        _store(samples, rows)
    except IntegrityError:
        # A pipeline was deleted during the round: store the others.
        alive = set(Pipeline.objects.values_list("pk", flat=True))
        _store(
            [x for x in samples if x.pipeline_id in alive],
            [x for x in rows if x.pipeline_id in alive],
        )
    seconds = time.perf_counter() - started
    summary = {
        "pipelines": len(pipelines),
        "lag_unknown": unknown,
        "kafka_bound_lookups": lookups.broker_lookups,
        "seconds": round(seconds, 3),
    }
    log.info("metrics round: %s", summary)
    return summary


def _store(samples: list[LagSample], rows: list[PipelineFigures]) -> None:
    with transaction.atomic():
        LagSample.objects.bulk_create(samples, batch_size=1000)
        PipelineFigures.objects.bulk_create(
            rows,
            batch_size=500,
            update_conflicts=True,
            unique_fields=["pipeline"],
            update_fields=[
                "collected_at",
                "figures",
                "lag_records",
                "lag_seconds",
                "lag_status",
                "lag_error",
                "backpressure",
                "last_commit_at",
                "data_loss_seconds",
                "start_offsets",
                "dead_letters",
                "writers_sampled_at",
                "writers_sampled_to",
            ],
        )
