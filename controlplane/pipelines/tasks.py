"""Celery tasks: thin wrappers that call into domain modules."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import reconciler


@shared_task(name="controlplane.pipelines.tasks.reconcile", ignore_result=True)
def reconcile() -> dict:
    return reconciler.tick(now=timezone.now())
