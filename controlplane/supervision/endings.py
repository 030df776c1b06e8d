"""How a run ends: the one place a run is recorded as ended and its pipeline settled (at rest,
or by its restart policy). The reconciler (a driver seen gone, killed for a lost heartbeat...),
a shared application's step (its process ended, a recycle), the drivers' exit reports and the
on-call controls all end runs through here; none of them imports another to do it.

Every end is a conditional update under the pipeline's row lock, taken before the run's (the
one lock order): a run ends once, whoever sees it first."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from controlplane.definitions.models import DesiredState, Failure, Pipeline, Run, RunState
from controlplane.redaction import redact
from jobs.spec import SpecError, parse_spec
from jobs.spec.model import NoRestart

from . import explain, failures, launcher, restarts
from .causes import AS_ASKED, EndCause
from .status import transition
from .transitions import Observation

log = logging.getLogger("controlplane.reconciler")


def lock_pipeline(pipeline_id: int) -> Pipeline | None:
    """The pipeline's row lock (waiting for it): always taken before its run's row."""
    return Pipeline.objects.select_for_update().filter(pk=pipeline_id).first()


def kill_run(run: Run, now: datetime, *, exit_code: int | None, cause: str, error: str) -> bool:
    """Kill the run's driver and record its end with `cause`. A query in a shared application
    is killed by asking its application: the run stays active (stopping) until the
    application says the query ended, then ends with `cause`. True if it ended now."""
    if launcher.kill(run):
        return finish(run, now, exit_code=exit_code, cause=cause, error=error)
    request_kill(run, now, cause=cause, error=error)
    return False


def request_kill(run: Run, now: datetime, *, cause: str, error: str) -> None:
    """Record that the run is being killed (it stays active, stopping): its own host's step
    kills it (`_observe`), or its application ends its query; it then ends with `cause`."""
    Run.objects.filter(pk=run.pk, state__in=RunState.active(), kill_requested_at=None).update(
        state=RunState.STOPPING, kill_requested_at=now, end_cause=cause, error_tail=error
    )


def exit_cause(run: Run, exit_code: int | None) -> str:
    if run.end_cause:
        return run.end_cause  # what it was being killed or stopped for
    if run.stop_requested_at:
        return EndCause.STOPPED
    return EndCause.EXITED if exit_code == 0 else EndCause.CRASHED


def record_exit(
    run: Run,
    now: datetime,
    *,
    exit_code: int | None,
    error: str,
    failure: dict | None = None,
    current_only: bool = False,
) -> bool:
    """The driver exited (its supervisor says so): end the run; False if already ended (or,
    with `current_only`, if it is no longer the pipeline's current run). `failure`: the
    driver's verdict on its failure, permanent or transient (controlplane.supervision.failures)."""
    with transaction.atomic():
        pipeline = lock_pipeline(run.pipeline_id)  # pipeline, then run: as everywhere
        run.refresh_from_db(fields=["state", "stop_requested_at", "end_cause", "error_tail"])
        if pipeline is None or run.state not in RunState.active():
            return False
        if current_only and run.generation != pipeline.generation:
            return False
        cause = exit_cause(run, exit_code)
        error = error or run.error_tail  # a killed query's own report has no error: its cause's
        return _finish(
            run, pipeline, now, exit_code=exit_code, cause=cause, error=error, failure=failure
        )


def finish(run: Run, now: datetime, *, exit_code: int | None, cause: str, error: str) -> bool:
    """Record a run's end and settle its pipeline (only if the run is still current): at
    rest if it was asked to stop, else per its restart policy. One transaction, under the
    pipeline's row lock (taken first: the one lock order): nobody sees the run ended while
    its pipeline still says it runs. False if the run had ended already."""
    with transaction.atomic():
        pipeline = lock_pipeline(run.pipeline_id)
        if pipeline is None:
            return False  # deleted, and its runs with it
        return _finish(run, pipeline, now, exit_code=exit_code, cause=cause, error=error)


def _finish(
    run: Run,
    pipeline: Pipeline,
    now: datetime,
    *,
    exit_code: int | None,
    cause: str,
    error: str,
    failure: dict | None = None,
) -> bool:
    ended = Run.objects.filter(pk=run.pk, state__in=RunState.active()).update(
        state=RunState.EXITED, ended_at=now, exit_code=exit_code, cause=cause, error_tail=error
    )
    if not ended:
        return False  # another worker recorded it first
    log.info(
        "pipeline %s: run %s ended (%s, exit %s)", pipeline.name, run.generation, cause, exit_code
    )
    if pipeline.generation != run.generation:
        return True
    if cause in AS_ASKED or pipeline.desired_state != DesiredState.RUNNING:
        transition(pipeline, Observation.ENDED, if_generation=run.generation, next_attempt_at=None)
        return True
    _failed(pipeline, run, now, cause=cause, error=error, failure=failure, exit_code=exit_code)
    return True


def _failed(
    pipeline: Pipeline,
    run: Run,
    now: datetime,
    *,
    cause: str,
    error: str,
    failure: dict | None = None,
    exit_code: int | None = None,
) -> None:
    """A run the pipeline still wanted ended: record the failure, ask the restart policy.
    Permanent or not is the driver's verdict (`failure`), by the exception's type; without
    one (an older driver, a launch failure) the error output is read (failures.judge)."""
    judgement = failures.judge(failure, error, cause)
    permanent = judgement.permanent
    said = explain.cause_of(cause, exit_code, error, judgement.verdict)
    this = restarts.Failure(
        at=now, cause=judgement.cause, started_at=run.started_at, permanent=permanent
    )
    earlier = pipeline.failures.all()
    if pipeline.restarts_since is not None:
        earlier = earlier.filter(at__gte=pipeline.restarts_since)
    history = [
        restarts.Failure(at=f.at, cause=f.cause, started_at=f.run_started_at, permanent=f.permanent)
        for f in earlier
    ]
    try:
        policy = parse_spec(pipeline.spec).restart_policy
        decision = restarts.decide(policy, [*history, this], now, seed=str(pipeline.pk))
        reason = redact(failures.decision_reason(judgement, decision.reason))
    except SpecError as exc:
        # A definition stored by an earlier version that this one refuses (a check added or
        # tightened since): its driver refuses it at every start too, so this is permanent,
        # whatever the policy it names; it waits for an edit. (Raising here would roll the
        # tick back and leave the run unrecorded at every tick.)
        permanent = True
        decision = restarts.decide(NoRestart(), [this], now)
        reason = redact(
            f"gave up: the stored definition no longer validates ({exc}); edit the pipeline"
            " (permanent: restarting cannot fix it)"
        )
    Failure.objects.create(
        pipeline=pipeline,
        run=run,
        at=now,
        cause=cause,
        message=redact(error),
        reason=redact(said.line),
        category=said.category,
        permanent=permanent,
        run_started_at=run.started_at,
        decision=reason,
        restart_at=decision.restart_at,
    )
    transition(
        pipeline,
        Observation.FAILED_RESTART if decision.restart else Observation.FAILED_GIVE_UP,
        if_generation=run.generation,
        next_attempt_at=decision.restart_at if decision.restart else None,
        attempt=decision.attempt,
    )
    log.warning("pipeline %s: run %s %s: %s", pipeline.name, run.generation, cause, reason)
