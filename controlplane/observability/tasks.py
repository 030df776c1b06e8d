"""Celery tasks of observability: thin wrappers that call into domain modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import collector, retention


@shared_task(
    name="controlplane.observability.tasks.compact_progress", ignore_result=True, acks_late=False
)
def compact_progress() -> dict:
    """Keep progress history bounded (raw, then hourly roll-ups, then gone)."""
    return retention.compact_progress(timezone.now())


@shared_task(
    name="controlplane.observability.tasks.collect_metrics", ignore_result=True, acks_late=False
)
def collect_metrics() -> dict:
    """Every pipeline's figures and a lag sample each (see `collector`)."""
    return collector.collect(timezone.now())
