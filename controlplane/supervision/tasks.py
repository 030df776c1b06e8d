"""Celery tasks of supervision: thin wrappers that call into the reconciler."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from celery import shared_task
from django.utils import timezone

from . import applications, auto_rollback, reconciler, restore_points

log = logging.getLogger("controlplane.tasks")


@shared_task(name="controlplane.supervision.tasks.reconcile", ignore_result=True, acks_late=False)
def reconcile() -> dict:
    return reconciler.tick(now=timezone.now())


@shared_task(
    name="controlplane.supervision.tasks.reconcile_host", ignore_result=True, acks_late=False
)
def reconcile_host() -> dict:
    """The part of the tick that touches processes, on the host that runs them (sent to
    each live host's own queue by the coordinator's tick)."""
    return reconciler.host_tick(now=timezone.now())


@shared_task(name="controlplane.supervision.tasks.reconcile_pipeline", ignore_result=True)
def reconcile_pipeline(pipeline_id: int, placed: bool = False) -> str | None:
    """Act on one pipeline now (after an operator's command, or sent to the host that runs
    its driver, or, `placed`, to the host chosen for its next one) instead of at the next
    tick."""
    return reconciler.reconcile_pipeline(pipeline_id, timezone.now(), wait=True, placed=placed)


@shared_task(name="controlplane.supervision.tasks.reconcile_application", ignore_result=True)
def reconcile_application(app_id: int, placed: bool = False) -> str | None:
    """Act on one shared application on this host (the coordinator placed it here)."""
    return applications.reconcile_application(app_id, timezone.now(), placed=placed)


@shared_task(name="controlplane.supervision.tasks.restore_points", ignore_result=True)
def take_restore_points() -> dict:
    """Scheduled restore points, and their retention (every minute, from beat)."""
    return restore_points.tick(timezone.now())


@shared_task(name="controlplane.supervision.tasks.auto_rollback", ignore_result=True)
def roll_back_bad_deploys() -> dict:
    """Automatic rollback of bad deploys (every 30 s, from beat)."""
    return auto_rollback.check(timezone.now())


# Nudges are sent from one background thread, so a request never waits on the broker: with
# Redis down or paused, the request has already answered (the change is in Postgres) and the
# beat tick acts on it once the broker is back.
_nudger = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cp-nudge")
_pending = threading.BoundedSemaphore(100)


def nudge(pipeline_id: int) -> None:
    """Ask a worker to reconcile one pipeline now; never blocks, never raises. Call it after
    the transaction that changed the pipeline commits (transaction.on_commit)."""
    if not _pending.acquire(blocking=False):
        return  # the broker is not keeping up: the next tick does the same work

    def send() -> None:
        try:
            reconcile_pipeline.apply_async(args=[pipeline_id], retry=False)
        except Exception as exc:  # the broker is down: the beat tick picks the change up
            log.warning("could not enqueue a reconcile of pipeline %s: %s", pipeline_id, exc)
        finally:
            _pending.release()

    _nudger.submit(send)
