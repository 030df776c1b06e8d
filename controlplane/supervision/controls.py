"""On-call controls: start, stop, kill, restart, suspend, resume, restart-now, reset-restarts.

Each is one transaction under the pipeline's row lock: it changes what is desired (the
reconciler does the rest), and writes an audit entry with who, what, when, why, and the state
before and after. Each is idempotent: asking again for what is already so changes nothing
(and is audited as such). `kill` is the one that acts at once: it kills the driver's process
tree now instead of waiting for a graceful stop.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import transaction

from controlplane.definitions import audit, services
from controlplane.definitions.models import DesiredState, Pipeline, Run, RunState, Status

from . import endings, hosts
from .causes import EndCause
from .status import transition
from .transitions import Observation


class NotApplicable(Exception):
    """The action makes no sense in the pipeline's current state (answered with 409)."""


# Each action: what changes in what is desired, and the observation (if any) the status
# follows, by the transition table (controlplane.supervision.transitions).
Change = tuple[dict, Observation | None]


def _start(pipeline: Pipeline, now: datetime) -> Change:
    given_up = pipeline.status in (Status.FAILED, Status.BACKING_OFF)
    if pipeline.desired_state == DesiredState.RUNNING and not given_up:
        return {}, None  # already wanted running, and not given up on: nothing to do
    # A start by hand: the restart policy counts failures from here on, and a failed or
    # backing-off pipeline is launched at once.
    changes = {
        "desired_state": DesiredState.RUNNING,
        "restarts_since": now,
        "attempt": 0,
        "next_attempt_at": None,
    }
    return changes, Observation.START if given_up else None


def _stop(pipeline: Pipeline, now: datetime) -> Change:
    return {"desired_state": DesiredState.STOPPED, "next_attempt_at": None}, None


def _suspend(pipeline: Pipeline, now: datetime) -> Change:
    return {"desired_state": DesiredState.SUSPENDED, "next_attempt_at": None}, None


def _resume(pipeline: Pipeline, now: datetime) -> Change:
    if pipeline.desired_state == DesiredState.STOPPED:
        raise NotApplicable(f"pipeline {pipeline.name!r} is stopped, not suspended: start it")
    return _start(pipeline, now)


def _restart(pipeline: Pipeline, now: datetime) -> Change:
    changes, observation = _start(pipeline, now)
    changes = changes or {"restarts_since": now, "attempt": 0}
    if pipeline.runs.filter(state__in=RunState.active()).exists():
        # The current run stops being the wanted one: the reconciler stops it gracefully
        # (its reports are refused from now on), then starts the next generation.
        changes["generation"] = pipeline.generation + 1
        observation = Observation.RESTART
    return changes, observation


def _restart_now(pipeline: Pipeline, now: datetime) -> Change:
    if pipeline.status == Status.BACKING_OFF:
        return {"next_attempt_at": now}, None
    if pipeline.status in (Status.RESTARTING, Status.STARTING):
        return {}, None
    raise NotApplicable(
        f"pipeline {pipeline.name!r} has no restart pending (it is {pipeline.status})"
    )


def _reset_restarts(pipeline: Pipeline, now: datetime) -> Change:
    return {"restarts_since": now, "attempt": 0}, None


ACTIONS: dict[str, Callable[[Pipeline, datetime], Change]] = {
    "start": _start,
    "stop": _stop,
    "kill": _stop,  # the same desire; act() then kills the driver instead of waiting
    "restart": _restart,
    "suspend": _suspend,
    "resume": _resume,
    "restart-now": _restart_now,
    "reset-restarts": _reset_restarts,
}


def _kill(run: Run, now: datetime, *, error: str) -> None:
    """Kill the run's driver: here, at once (a query in a shared application is stopped now
    and its run ends when the application says so); on another host, by asking that host
    (the nudge that follows the command is sent to its queue, where the driver is killed);
    a run still starting elsewhere, with no process yet, or on a lost host, just ends (its
    launch kills what it started when it finds the run ended; a lost host's token is
    revoked with it)."""
    if not run.host or run.host == hosts.here():
        endings.kill_run(run, now, exit_code=-9, cause=EndCause.KILLED, error=error)
    elif not run.pid or hosts.is_lost(run.host, now):
        endings.finish(run, now, exit_code=-9, cause=EndCause.KILLED, error=error)
    else:
        endings.request_kill(run, now, cause=EndCause.KILLED, error=error)


def act(pipeline: Pipeline, action: str, *, user, reason: str, now: datetime) -> Pipeline:
    """Carry out an on-call action and audit it; returns the pipeline as it now is."""
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        before = audit.snapshot(locked)
        changes, observation = ACTIONS[action](locked, now)
        if observation is not None:
            transition(locked, observation, **changes, updated_by=user)
        elif changes:
            Pipeline.objects.filter(pk=locked.pk).update(**changes, updated_by=user, updated_at=now)
        if action == "kill":
            for run in Run.objects.filter(pipeline=locked, state__in=RunState.active()):
                _kill(run, now, error=f"killed by {user}: {reason}")
        locked.refresh_from_db()
        audit.record(locked, action, user=user, reason=reason, before=before)
    return locked


def rollback(pipeline: Pipeline, to_version: int, *, user, reason: str, now: datetime) -> Pipeline:
    """Make version `to_version`'s spec current again (definitions.services.rollback_pipeline:
    raises SpecError, Invalid or Conflict); a pipeline with a driver is restarted gracefully
    so that the older spec runs. Returns the pipeline as it now is."""
    changed = services.rollback_pipeline(pipeline, to_version=to_version, user=user, reason=reason)
    pipeline.refresh_from_db()
    if changed and Run.objects.filter(pipeline=pipeline, state__in=RunState.active()).exists():
        why = f"rollback to version {to_version}" + (f": {reason}" if reason else "")
        pipeline = act(pipeline, "restart", user=user, reason=why, now=now)
    return pipeline
