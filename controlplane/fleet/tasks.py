"""Celery tasks of definitions as code: thin wrappers that call into the fleet's modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import drift


@shared_task(name="controlplane.fleet.tasks.check_drift", ignore_result=True, acks_late=False)
def check_drift() -> dict:
    """Mark managed objects changed outside their files (drifted_at), clear those back."""
    return drift.check(timezone.now())
