"""The reconcile tick: compare desired state with what is observed, and act.

For now (before the Spark runtime lands) a tick records that it ran and reports, per pipeline,
what it would do. It is idempotent: running it twice, or from two workers at once, is harmless.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.db.models import F

from .models import DesiredState, Pipeline, ReconcilerState, Status

log = logging.getLogger("controlplane.reconciler")


def planned_action(desired_state: str, status: str) -> str | None:
    """What the reconciler would do for one pipeline, or None when nothing is needed."""
    if desired_state == DesiredState.RUNNING and status in (Status.STOPPED, Status.FAILED):
        return "start"
    if desired_state == DesiredState.STOPPED and status not in Status.terminal():
        return "stop"
    if desired_state == DesiredState.SUSPENDED and status not in Status.terminal():
        return "suspend"
    return None


def tick(now: datetime) -> dict:
    plan: dict[str, str] = {}
    for name, desired, status in Pipeline.objects.values_list("name", "desired_state", "status"):
        action = planned_action(desired, status)
        if action:
            plan[name] = action
            log.info(
                "reconcile: pipeline %s is %s, desired %s: would %s", name, status, desired, action
            )
    summary = {"pipelines": Pipeline.objects.count(), "actions": plan}
    with transaction.atomic():
        ReconcilerState.objects.get_or_create(id=1)
        ReconcilerState.objects.filter(id=1).update(
            last_tick_at=now, ticks=F("ticks") + 1, last_summary=summary
        )
    return summary
