"""Celery tasks of observability: thin wrappers that call into domain modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import retention


@shared_task(name="controlplane.observability.tasks.compact_progress", ignore_result=True)
def compact_progress() -> dict:
    """Keep progress history bounded (raw, then hourly roll-ups, then gone)."""
    return retention.compact_progress(timezone.now())
