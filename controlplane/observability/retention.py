"""Keeping progress history bounded: raw batch progress (and the stateful operators'
samples that came with it) for a while, then hourly roll-ups, then nothing. Runs from a beat
task; idempotent (rolling up twice adds nothing twice: the raw rows rolled up are deleted in
the same transaction)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Sum
from django.db.models.functions import Coalesce, TruncHour

from controlplane.definitions.models import BatchProgress, LagSample, ProgressRollup, StateRollup

from . import state

log = logging.getLogger("controlplane.retention")


def compact_progress(now: datetime) -> dict:
    """Roll raw progress older than CONTROLPLANE_PROGRESS_RAW_HOURS into hourly buckets and
    drop roll-ups older than CONTROLPLANE_PROGRESS_ROLLUP_DAYS."""
    raw_cutoff = now - timedelta(hours=settings.CONTROLPLANE_PROGRESS_RAW_HOURS)
    rollup_cutoff = now - timedelta(days=settings.CONTROLPLANE_PROGRESS_ROLLUP_DAYS)
    with transaction.atomic():
        old = BatchProgress.objects.filter(reported_at__lt=raw_cutoff)
        buckets = (
            old.annotate(bucket=TruncHour("reported_at"))
            .values("run__pipeline_id", "bucket")
            .annotate(
                batches=Count("id"),
                input_rows=Coalesce(Sum("num_input_rows"), 0),
                input_rps=Coalesce(Sum("input_rows_per_second"), 0.0),
                processed_rps=Coalesce(Sum("processed_rows_per_second"), 0.0),
                duration=Coalesce(Sum("batch_duration_ms"), 0),
                longest=Coalesce(Max("batch_duration_ms"), 0),
            )
        )
        rolled = 0
        for b in buckets:
            rollup, _ = ProgressRollup.objects.select_for_update().get_or_create(
                pipeline_id=b["run__pipeline_id"], bucket_start=b["bucket"], bucket_seconds=3600
            )
            rollup.batches += b["batches"]
            rollup.input_rows += b["input_rows"]
            rollup.sum_input_rows_per_second += b["input_rps"]
            rollup.sum_processed_rows_per_second += b["processed_rps"]
            rollup.sum_batch_duration_ms += b["duration"]
            rollup.max_batch_duration_ms = max(rollup.max_batch_duration_ms, b["longest"])
            rollup.save()
            rolled += b["batches"]
        deleted, _ = old.delete()
        expired, _ = ProgressRollup.objects.filter(bucket_start__lt=rollup_cutoff).delete()
        state_rolled = state.rollup(raw_cutoff)
        state_expired, _ = StateRollup.objects.filter(bucket_start__lt=rollup_cutoff).delete()
    sample_cutoff = now - timedelta(hours=settings.CONTROLPLANE_LAG_SAMPLE_HOURS)
    samples, _ = LagSample.objects.filter(at__lt=sample_cutoff).delete()
    if rolled or expired or samples or state_rolled or state_expired:
        log.info(
            "progress: %s raw rows rolled up, %s old roll-ups dropped, %s lag samples dropped; "
            "state: %s samples rolled up, %s old roll-ups dropped",
            rolled,
            expired,
            samples,
            state_rolled,
            state_expired,
        )
    return {
        "rolled_up": rolled,
        "deleted": deleted,
        "expired_rollups": expired,
        "expired_lag_samples": samples,
        "state_rolled_up": state_rolled,
        "expired_state_rollups": state_expired,
    }
