"""Celery tasks: thin wrappers that call into domain modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import reconciler, retention


@shared_task(name="controlplane.pipelines.tasks.reconcile", ignore_result=True)
def reconcile() -> dict:
    return reconciler.tick(now=timezone.now())


@shared_task(name="controlplane.pipelines.tasks.reconcile_pipeline", ignore_result=True)
def reconcile_pipeline(pipeline_id: int) -> str | None:
    """Act on one pipeline now (after an operator's command) instead of at the next tick."""
    return reconciler.reconcile_pipeline(pipeline_id, timezone.now())


@shared_task(name="controlplane.pipelines.tasks.compact_progress", ignore_result=True)
def compact_progress() -> dict:
    """Keep progress history bounded (raw, then hourly roll-ups, then gone)."""
    return retention.compact_progress(timezone.now())
