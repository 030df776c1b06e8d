"""Celery tasks of observability: thin wrappers that call into domain modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import collector, dead_letters, retention


@shared_task(
    name="controlplane.observability.tasks.purge_dead_letters", ignore_result=True, acks_late=False
)
def purge_dead_letters() -> int:
    """Dead letters older than CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS go (hourly)."""
    return dead_letters.purge(timezone.now())


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
