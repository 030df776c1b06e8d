"""The reconcile tick: compare desired state with what is observed, and act.

Level-based and idempotent: every tick looks afresh at each pipeline that is not at rest
(`controlplane.supervision.attention` finds them: a healthy running pipeline, or a stopped
one, is not visited), so a lost, late or duplicated tick is harmless. Each pipeline is
handled under its row lock (skipped if another worker holds it), and the database refuses a
second active run for one pipeline, so two workers can never start two drivers.

A run that ends without being asked to is a failure: it is recorded (the pipeline's
exceptions history) and the pipeline's restart policy (`controlplane.supervision.restarts`) decides
whether and when to restart. The restart time is stored (`next_attempt_at`); a later tick
starts the new run once it is due. Failures are detected three ways: the supervisor's exit
report, the supervisor's process vanishing, and heartbeats that stop coming.

Locks are always taken in one order, the pipeline's row, then its run's (the tick, the
on-call controls, the supervisor's exit report and the end of a launch alike), so that they
never deadlock. A run's row holds its token digest, directory and host before its process
exists; a launch whose run ended meanwhile (killed while starting, or given up on as lost)
kills the driver it started. Only runs on this host are acted on: one on another host is
left alone, and the pipeline says so (`status_message`).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

import requests
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Concat

from controlplane.definitions.models import (
    DEDICATED,
    DesiredState,
    Pipeline,
    ReconcilerState,
    Run,
    RunState,
    Status,
)

from . import (
    applications,
    attention,
    hosts,
    launcher,
    restore_points,
    silence,
    transitions,
)
from .causes import EndCause
from .endings import exit_cause, finish, kill_run, lock_pipeline, record_exit
from .status import transition
from .transitions import Action, Observation

log = logging.getLogger("controlplane.reconciler")

# A run row whose launch never completed (the worker died mid-launch) is given up after this.
LAUNCH_GRACE = timedelta(seconds=60)
# How long a nudged reconcile waits for its pipeline's row (held by the tick, a report).
NUDGE_LOCK_WAIT = 5.0


def tick(now: datetime) -> dict:
    """The coordinator's tick (beat sends it to whichever worker takes it): lost hosts, and
    placement of what is to start, decided here; then this host's own processes, and every
    other live host is asked to look at its own (`host_tick`, on its queue)."""
    _note_resumption(now)
    hosts.beat(now)
    lost = hosts.sweep(now)
    summary = _tick(now, coordinator=True)
    others = hosts.fan_out(now)
    if others:
        summary["hosts"] = others
    if lost:
        summary["lost_hosts"] = lost
    with transaction.atomic():
        ReconcilerState.objects.get_or_create(id=1)
        ReconcilerState.objects.filter(id=1).update(
            last_tick_at=now, ticks=F("ticks") + 1, last_summary=summary
        )
    return summary


def host_tick(now: datetime) -> dict:
    """One host's part of the tick: the runs and applications whose processes are here."""
    hosts.beat(now)
    return _tick(now, coordinator=False)


def _tick(now: datetime, *, coordinator: bool) -> dict:
    # Shared applications first: a pipeline placed in one this tick finds it started.
    applications_acted = applications.tick(now, coordinator=coordinator)
    actions: dict[str, str] = {}
    visits = attention.pipelines_to_visit(now, coordinator=coordinator)
    for pipeline_id, name in visits:
        try:
            action = reconcile_pipeline(pipeline_id, now)
        except Exception:  # one broken pipeline must not stop the others being reconciled
            log.exception("reconcile failed for pipeline %s", name)
            action = "error"
        if action:
            actions[name] = action
    summary = {"pipelines": Pipeline.objects.count(), "visited": len(visits), "actions": actions}
    if applications_acted:
        summary["applications"] = applications_acted
    return summary


def _note_resumption(now: datetime) -> None:
    """A tick after a gap (no tick for 3 intervals + 10 s: the database, the broker or the
    workers were down) records when the control plane could hear drivers again."""
    gap = timedelta(seconds=3 * settings.CONTROLPLANE_RECONCILE_SECONDS + 10)
    state, _ = ReconcilerState.objects.get_or_create(id=1)
    if state.last_tick_at is None or now - state.last_tick_at > gap:
        ReconcilerState.objects.filter(id=1).update(resumed_at=now)
        if state.last_tick_at is not None:
            log.warning(
                "no reconcile tick for %.0f s: drivers' silence is counted from now",
                (now - state.last_tick_at).total_seconds(),
            )


def _deaf_recently(now: datetime, window: timedelta) -> bool:
    """Whether the control plane came back within `window`: a driver's heartbeats or
    progress may have been lost with it (its reports got 503s), so it is not judged yet."""
    resumed = ReconcilerState.objects.filter(id=1).values_list("resumed_at", flat=True).first()
    return resumed is not None and timedelta(0) <= now - resumed <= window


def reconcile_pipeline(
    pipeline_id: int, now: datetime, *, wait: bool = False, placed: bool = False
) -> str | None:
    """One step towards the desired state for one pipeline; returns what it did.

    The tick passes over a pipeline whose row another transaction holds (it comes again in
    a few seconds). A nudge (`wait`: an exit report, an operator's command) waits for the
    row instead, at most NUDGE_LOCK_WAIT: passing over it, as the tick does, lost restarts
    whose exit was committed while the tick held the row, delaying them to the next tick.

    A step that touches a process on another host is sent there (`hosts`); `placed`: this
    host was chosen for the pipeline's next driver, which is launched here."""
    with transaction.atomic():
        if wait:
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL lock_timeout = '{int(NUDGE_LOCK_WAIT * 1000)}ms'")
                    pipeline = lock_pipeline(pipeline_id)
                    cursor.execute("SET LOCAL lock_timeout TO DEFAULT")
            except OperationalError:  # lock_timeout: the next tick does it
                log.warning("pipeline %s: its row stayed locked; left to the tick", pipeline_id)
                return None
        else:
            pipeline = (
                Pipeline.objects.select_for_update(skip_locked=True).filter(pk=pipeline_id).first()
            )
        if pipeline is None:
            return None  # deleted, or another worker holds it right now
        run = pipeline.runs.filter(state__in=RunState.active()).first()
        observed = None
        if run is not None:
            observed = _observe(pipeline, run, now)
            if observed is None or not _restart_due_now(pipeline, run, now):
                return observed
            # It ended, and its policy restarts it now (a delay of 0): in this same step, not
            # a tick later (the tick, not the exit report, may be the first to see an exit).
        observation = Observation.IDLE
        if pipeline.status == Status.BACKING_OFF and pipeline.desired_state == DesiredState.RUNNING:
            if pipeline.next_attempt_at and now < pipeline.next_attempt_at:
                return observed  # the policy's delay is not over yet
            observation = Observation.RESTART_DUE
        found = transitions.step(pipeline.status, pipeline.desired_state, observation)
        if found is None:
            return observed  # e.g. failed: the policy gave up, an operator starts it again
        if found.action is Action.SETTLE:
            if found.status == pipeline.status and pipeline.next_attempt_at is None:
                return None  # at rest already
            # No driver and none wanted (or it only looked alive): settle, drop any restart.
            if pipeline.status_message:
                _set_message(pipeline, "")
            transition(pipeline, observation, next_attempt_at=None)
            return "settle"
        started = _new_run(pipeline, now, observation, placed=placed)
        if started is None or isinstance(started, str):
            return ", ".join(a for a in (observed, started) if a) or None
    # Outside the transaction: the run row (with its token digest, directory and host) is
    # committed before any process exists, so a crash here leaves a visible 'starting' run
    # whose driver, if any, is refused (409) and found by its directory, never an untracked one.
    run, token = started
    launched = _launch(run, token, now)
    return f"{observed}, {launched}" if observed else launched


def _restart_due_now(pipeline: Pipeline, run: Run, now: datetime) -> bool:
    """Whether observing `run` just ended it and left its pipeline backing off with the
    restart already due."""
    run.refresh_from_db(fields=["state"])
    if run.state in RunState.active():
        return False
    pipeline.refresh_from_db()
    return (
        pipeline.status == Status.BACKING_OFF
        and pipeline.desired_state == DesiredState.RUNNING
        and pipeline.next_attempt_at is not None
        and pipeline.next_attempt_at <= now
    )


def _set_message(pipeline: Pipeline, message: str) -> None:
    Pipeline.objects.filter(pk=pipeline.pk).update(status_message=message)
    pipeline.status_message = message


def _new_run(
    pipeline: Pipeline, now: datetime, observation: Observation, *, placed: bool = False
) -> tuple[Run, str] | str | None:
    """A new 'starting' run row (with its token digest, directory and host), and its token;
    the pipeline takes the table's step for `observation` (a launch, or a relaunch). The run
    is made on the host its driver will run on: a dedicated driver goes to the host with
    room that `hosts` chooses, a shared application's member to its application's host;
    if that is another host, the step is sent there (returned: where)."""
    app = None
    if pipeline.placement != DEDICATED:
        app, waiting = applications.place(pipeline, now)
        if app is not None and app.host != hosts.here():
            return hosts.route_pipeline(app.host, pipeline.pk, placed=True)
    elif placed:
        if pipeline.placed_host and pipeline.placed_host != hosts.here():
            return None  # placed elsewhere since this was sent
        waiting = ""
    else:
        target, waiting = hosts.choose(now)
        if target is not None and target != hosts.here():
            return hosts.route_pipeline(target, pipeline.pk, placed=True, now=now)
    if waiting:
        if pipeline.status_message != waiting:
            _set_message(pipeline, waiting)
        return None
    if pipeline.status_message:
        _set_message(pipeline, "")
    generation = pipeline.generation + 1
    run = Run(
        pipeline=pipeline,
        generation=generation,
        spec_version=pipeline.version,
        state=RunState.STARTING,
        application=app,
        application_generation=app.generation if app else None,
    )
    token = launcher.prepare(run)
    try:
        with transaction.atomic():
            run.save(force_insert=True)
    except IntegrityError:
        return None  # another worker created the run first
    restart = observation is Observation.RESTART_DUE
    changes = {"generation": generation, "next_attempt_at": None}
    if pipeline.placed_host:
        changes.update(placed_host="", placed_at=None)
    if restart:
        changes["restarts"] = F("restarts") + 1
    transition(pipeline, observation, **changes)
    log.info(
        "pipeline %s: %s run %s",
        pipeline.name,
        f"restarting (attempt {pipeline.attempt}) with" if restart else "starting",
        generation,
    )
    return run, token


def _launch(run: Run, token: str, now: datetime) -> str:
    # A new spec version's first run on an existing checkpoint: keep the old one's first.
    restore_points.before_change(run, now)
    try:
        launcher.launch(run, token)
    except Exception as exc:
        log.exception("pipeline %s: launch failed", run.pipeline.name)
        finish(run, now, exit_code=None, cause=EndCause.LAUNCH_FAILED, error=str(exc))
        return EndCause.LAUNCH_FAILED
    with transaction.atomic():
        pipeline = lock_pipeline(run.pipeline_id)  # a kill either sees the pid, or ended it
        updated = Run.objects.filter(pk=run.pk, state=RunState.STARTING).update(
            pid=run.pid, process_started=run.process_started, started_at=now, state=RunState.RUNNING
        )
        if updated:
            if pipeline is not None:
                transition(pipeline, Observation.LAUNCHED, if_generation=run.generation)
            return "start"
    # The run ended while it was being launched (killed while starting, or given up on as
    # lost): the driver just started must not run on beside whatever comes next.
    log.warning(
        "pipeline %s: run %s ended while it was being launched; killing its driver (pid %s)",
        run.pipeline.name,
        run.generation,
        run.pid,
    )
    launcher.kill(run)
    Run.objects.filter(pk=run.pk).update(
        pid=run.pid,
        process_started=run.process_started,
        error_tail=Concat(
            F("error_tail"),
            Value(f"\n[the driver launched meanwhile (pid {run.pid}) was killed]"),
        ),
    )
    return "launch-aborted"


def _observe(pipeline: Pipeline, run: Run, now: datetime) -> str | None:
    if run.host and run.host != hosts.here():
        # Its process can be seen and signalled only on its own host: the step is sent
        # there. Only once that host has been silent past the timeout is the run given up:
        # ended, which revokes its token (a driver that is still alive there is refused at
        # its next report, and stops itself), and the pipeline restarts on a live host.
        seen = hosts.silent_since(run.host)
        if not hosts.lost(seen, now):
            return hosts.route_pipeline(run.host, pipeline.pk)
        error = (
            f"host {run.host} is lost (silent since {seen:%Y-%m-%d %H:%M:%S} UTC)"
            if seen
            else f"host {run.host} is lost (never heard from)"
        ) + ": the run's token is revoked"
        finish(run, now, exit_code=None, cause=run.end_cause or EndCause.HOST_LOST, error=error)
        return EndCause.HOST_LOST
    if pipeline.status_message and not pipeline.status_message.startswith(UNHEARD):
        _set_message(pipeline, "")
    report = launcher.exit_report(run) if run.run_dir else None
    if report is not None:
        code = report.get("exit_code")
        record_exit(
            run,
            now,
            exit_code=code,
            error=report.get("error_tail", ""),
            failure=report.get("failure"),  # the driver's verdict (checked where it is used)
        )
        return exit_cause(run, code)
    if run.state == RunState.STARTING and not run.pid:
        if now - run.created_at > LAUNCH_GRACE:
            # What the lost launch may have started (found by its run dir, or its assignment).
            kill_run(
                run,
                now,
                exit_code=None,
                cause=EndCause.LAUNCH_LOST,
                error="the launch never completed",
            )
            return EndCause.LAUNCH_LOST
        return None
    if launcher.alive(run) is False:
        if run.application_id is not None:
            # Its application's process is gone (which the application's own step records).
            cause = run.end_cause or EndCause.APPLICATION_LOST
            finish(run, now, exit_code=None, cause=cause, error="its application's process is gone")
            return cause
        launcher.kill(run)  # what the supervisor left behind, if anything
        finish(
            run, now, exit_code=None, cause=EndCause.VANISHED, error="the driver process is gone"
        )
        return EndCause.VANISHED
    if run.kill_requested_at is not None:
        # Killed (by an operator through another host's web app, or the reconciler): a
        # dedicated driver is killed here and now; a query in a shared application ends when
        # the application says so (asked again: idempotent), and one that does not give way
        # in time gets its application recycled.
        cause = run.end_cause or EndCause.KILLED
        exit_code = -9 if run.application_id is None else None
        if kill_run(run, now, exit_code=exit_code, cause=cause, error=run.error_tail):
            return cause
        waited = now - run.kill_requested_at
        if waited > timedelta(seconds=settings.CONTROLPLANE_KILL_TIMEOUT):
            reason = (
                f"pipeline {pipeline.name} run {run.generation} did not stop within "
                f"{settings.CONTROLPLANE_KILL_TIMEOUT:g} s of being killed ({run.end_cause})"
            )
            if applications.request_recycle(
                run.application_id, run.application_generation, reason, now
            ):
                return "recycle"
        return None
    for cause, check in ((EndCause.NO_HEARTBEAT, _heartbeat_overdue), (EndCause.STALLED, _stalled)):
        problem = check(run, now) if run.state == RunState.RUNNING else None
        if problem is not None and (why := reports_cannot_arrive()):
            # The driver's reports go through the web app: while it does not answer, a silent
            # driver is not a lost one, and killing every pipeline for it would turn an outage
            # of the control plane into an outage of the data.
            message = f"{UNHEARD}: run {run.generation} {problem}, but {why}; it is not killed"
            if pipeline.status_message != message:
                log.warning("pipeline %s: %s", pipeline.name, message)
                _set_message(pipeline, message)
            return "unheard"
        if problem is not None:
            if pipeline.status_message.startswith(UNHEARD):
                _set_message(pipeline, "")
            log.warning(
                "pipeline %s: run %s %s; killing it", pipeline.name, run.generation, problem
            )
            kill_run(run, now, exit_code=None, cause=cause, error=problem)
            return cause
    if pipeline.status_message.startswith(UNHEARD):
        _set_message(pipeline, "")  # heard again
    if pipeline.desired_state != DesiredState.RUNNING or pipeline.generation != run.generation:
        return _stop(pipeline, run, now)
    return None


UNHEARD = "not heard"
_ingestion = {"checked": float("-inf"), "why": None}


def reports_cannot_arrive(max_age: float = 10.0) -> str | None:
    """Why drivers' reports cannot be reaching the control plane (the web app they are sent
    to, CONTROLPLANE_URL, does not answer), or None. Checked at most every `max_age` seconds,
    and only when some run looks silent."""
    now = time.monotonic()
    if now - _ingestion["checked"] < max_age:
        return _ingestion["why"]
    url = f"{settings.CONTROLPLANE_URL.rstrip('/')}/healthz"
    try:
        requests.get(url, timeout=3)  # any answer, even a 503, means reports can arrive
        why = None
    except requests.RequestException as exc:
        why = f"the web app at {settings.CONTROLPLANE_URL} does not answer ({type(exc).__name__})"
    _ingestion.update(checked=time.monotonic(), why=why)
    return why


def _heartbeat_overdue(run: Run, now: datetime) -> str | None:
    """Why the run counts as lost (no heartbeat in time), or None while it is heard from."""
    return silence.heartbeat_overdue(
        started_at=run.started_at,
        last_heartbeat_at=run.last_heartbeat_at,
        now=now,
        timeout=timedelta(seconds=settings.CONTROLPLANE_HEARTBEAT_TIMEOUT),
        grace=timedelta(seconds=settings.CONTROLPLANE_STARTUP_GRACE),
        deaf=lambda window: _deaf_recently(now, window),
    )


def _stalled(run: Run, now: datetime) -> str | None:
    """Why the run counts as stalled (alive, but no batch completed and no idle report for
    max(CONTROLPLANE_STALL_SECONDS, 10 triggers)), or None."""
    return silence.stalled(
        started_at=run.started_at,
        last_batch_at=run.last_batch_at,
        last_idle_at=run.last_idle_at,
        now=now,
        window=silence.stall_window(
            settings.CONTROLPLANE_STALL_SECONDS, run.pipeline.trigger_seconds
        ),
        grace=timedelta(seconds=settings.CONTROLPLANE_STARTUP_GRACE),
        deaf=lambda window: _deaf_recently(now, window),
    )


def _stop(pipeline: Pipeline, run: Run, now: datetime) -> str | None:
    if run.stop_requested_at is None:
        launcher.request_stop(run)
        Run.objects.filter(pk=run.pk).update(state=RunState.STOPPING, stop_requested_at=now)
        transition(pipeline, Observation.UNWANTED)
        log.info("pipeline %s: graceful stop of run %s requested", pipeline.name, run.generation)
        return "stop"
    if now - run.stop_requested_at > timedelta(seconds=settings.CONTROLPLANE_STOP_TIMEOUT):
        log.warning(
            "pipeline %s: run %s ignored the stop; killing it", pipeline.name, run.generation
        )
        kill_run(
            run, now, exit_code=-9, cause=EndCause.KILLED, error="did not stop within the timeout"
        )
        return "kill"
    return None
