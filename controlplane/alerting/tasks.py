"""Celery tasks of alerting: thin wrappers, run by beat apart from the reconcile tick."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from . import delivery, engine


@shared_task(
    name="controlplane.alerting.tasks.evaluate_alerts", ignore_result=True, acks_late=False
)
def evaluate_alerts() -> dict:
    return engine.evaluate(timezone.now())


@shared_task(name="controlplane.alerting.tasks.deliver_alerts", ignore_result=True, acks_late=False)
def deliver_alerts() -> dict:
    return delivery.deliver(timezone.now())
