"""Shared Spark applications: placing pipelines in them, and keeping them as desired.

An application is reconciled like a run: each tick compares what is desired (running or
stopped) with what is observed (its supervisor's process, `ready.json`, `exit.json`) and
takes one step. Its status is written only here, with conditional updates on the status and
generation it was read with, under its row lock (skipped if another worker holds it). The
application's row lock is always the last one taken (after a pipeline's), and no pipeline or
run is touched while it is held, so the two never deadlock.

What happens to members follows from the application's fate:
- it died (its supervisor reported, or its process is gone): every member's run ends with
  cause `application-lost`, a failure each pipeline's restart policy judges; the application
  is started again at once (after a loss in a row, with a growing delay, up to a minute);
- a member's query would not stop when killed (`recycle`): the other members are stopped
  gracefully (cause `recycled`, not a failure: they start again as soon as the application
  is back), then the process is killed and started again; the stuck member's run ends with
  the cause it was killed for;
- it is stopped by an operator: only once it has no members (the API refuses otherwise).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q

from controlplane.definitions.models import (
    AUTO,
    ApplicationStatus,
    DesiredState,
    Pipeline,
    Run,
    RunState,
    SparkApplication,
)

from . import endings, hosts, launcher
from .causes import EndCause

log = logging.getLogger("controlplane.applications")

# Delays before starting an application again after 1, 2, 3... losses in a row; a loss after
# it has been up for RESET_AFTER starts the count again.
BACKOFF_SECONDS = (0, 2, 5, 10, 20, 40, 60)
RESET_AFTER = timedelta(seconds=60)
LAUNCH_GRACE = timedelta(seconds=60)
TAKES_MEMBERS = (ApplicationStatus.STARTING, ApplicationStatus.RUNNING)


def backoff(attempt: int) -> timedelta:
    return timedelta(seconds=BACKOFF_SECONDS[min(max(attempt, 1), len(BACKOFF_SECONDS)) - 1])


def members(app: SparkApplication):
    """The active runs placed in the application's current process."""
    return Run.objects.filter(
        application=app, application_generation=app.generation, state__in=RunState.active()
    )


def with_members(queryset=None):
    """Applications annotated with `member_count`: their active runs."""
    queryset = SparkApplication.objects.all() if queryset is None else queryset
    return queryset.annotate(
        member_count=Count(
            "runs",
            filter=Q(runs__state__in=RunState.active())
            & Q(runs__application_generation=F("generation")),
        )
    )


# -- placement (called under the pipeline's row lock) -------------------------------------


def place(pipeline: Pipeline, now: datetime) -> tuple[SparkApplication | None, str]:
    """The shared application the pipeline's next run goes into, locked (so that capacity
    holds against concurrent placements), or None and why it has to wait. Applications on
    any live host count (the member's launch is then sent to the application's host)."""
    candidates = SparkApplication.objects.filter(
        desired_state=DesiredState.RUNNING,
        status__in=TAKES_MEMBERS,
        pid__isnull=False,
        host__in=hosts.live(now),
    )
    if pipeline.placement != AUTO:
        named = SparkApplication.objects.filter(name=pipeline.placement).first()
        if named is None:
            return None, f"waiting: shared application {pipeline.placement!r} does not exist"
        candidates = candidates.filter(pk=named.pk)
        if not candidates.exists():
            return None, (
                f"waiting: shared application {named.name!r} is {named.status}"
                + (f" (wanted {named.desired_state})" if named.desired_state != "running" else "")
            )
    # Lock them (in one order: by id) before counting their members.
    ids = list(candidates.select_for_update().order_by("pk").values_list("pk", flat=True))
    ranked = sorted(
        with_members(SparkApplication.objects.filter(pk__in=ids)),
        key=lambda a: (a.member_count - a.capacity, a.name),
    )
    for app in ranked:
        if app.member_count < app.capacity:
            return app, ""
    if pipeline.placement != AUTO:
        return None, f"waiting: shared application {pipeline.placement!r} is full"
    if not ranked:
        return None, "waiting: no shared application is running"
    return None, "waiting: every shared application is full"


def request_recycle(app_id: int, generation: int | None, reason: str, now: datetime) -> bool:
    """A member's query would not stop: recycle the application (once per process)."""
    updated = _write(
        app_id,
        {"generation": generation, "status__in": TAKES_MEMBERS, "recycle_requested_at": None},
        status=ApplicationStatus.RECYCLING,
        recycle_requested_at=now,
        recycle_reason=reason,
    )
    if updated:
        log.warning("application %s: recycling it: %s", app_id, reason)
    return bool(updated)


# -- the reconcile step --------------------------------------------------------------------


def tick(now: datetime, *, coordinator: bool = True) -> dict[str, str]:
    """Each application this tick looks after: those whose process is (or is being started)
    on this host; the coordinator's tick also those to launch (placed on a host with room)
    and those on a host that is lost."""
    actions = {}
    here = hosts.here()
    for app_id, name, host, pid, status in SparkApplication.objects.values_list(
        "id", "name", "host", "pid", "status"
    ):
        has_process = bool(pid) or status == ApplicationStatus.STARTING
        if has_process and host and host != here:
            if not (coordinator and hosts.is_lost(host, now)):
                continue  # its own host's tick looks after it
        elif not has_process and not coordinator:
            continue
        try:
            action = reconcile_application(app_id, now)
        except Exception:  # one broken application must not stop the others
            log.exception("reconcile failed for application %s", name)
            action = "error"
        if action:
            actions[name] = action
    return actions


def reconcile_application(app_id: int, now: datetime, *, placed: bool = False) -> str | None:
    """One step towards the application's desired state; returns what it did. `placed`:
    the coordinator chose this host for its next process."""
    ended_members = None
    with transaction.atomic():
        app = SparkApplication.objects.select_for_update(skip_locked=True).filter(pk=app_id).first()
        if app is None:
            return None
        elsewhere = bool(app.host) and app.host != hosts.here()
        has_process = bool(app.pid) or app.status == ApplicationStatus.STARTING
        if elsewhere and has_process:
            if not hosts.is_lost(app.host, now):
                return None  # another host's: seen and signalled there
            # Its host is lost: so is its process (its members' tokens are revoked as they end).
            ended_members = _ended(app, {"error_tail": f"host {app.host} is lost"}, now)
            action = ended_members[0]
        elif app.pid:
            _measure(app, now)
            report = launcher.application_exit_report(app)
            if report is not None or launcher.application_alive(app) is False:
                ended_members = _ended(app, report, now)
                action = ended_members[0]
            else:
                action = _running(app, now)
        else:
            action = _not_running(app, now, placed=placed)
    if ended_members is not None:
        _end_members(*ended_members[1:], now)
        if action in ("recycled", "lost") and app.next_attempt_at <= now:
            reconcile_application(app_id, now)  # started again at once
    elif action == "launch":
        return _launch(app, now)
    elif action == "recycling":
        _recycle(app, now)
    return action


def _write(app_id: int, conditions: dict, **changes) -> bool:
    """The one write of an application's status (and what goes with it): a conditional
    update, on what the caller read; False if the row had moved on."""
    return bool(SparkApplication.objects.filter(pk=app_id, **conditions).update(**changes))


def _set(app: SparkApplication, **changes) -> bool:
    """`_write` on the status and generation `app` was read with; `app` follows."""
    updated = _write(app.pk, {"status": app.status, "generation": app.generation}, **changes)
    for field, value in changes.items():
        if not hasattr(value, "resolve_expression"):
            setattr(app, field, value)
    return bool(updated)


def _measure(app: SparkApplication, now: datetime) -> None:
    measured = launcher.measure(app)
    if measured is None:
        return
    rss, cpu = measured
    percent = None
    if app.cpu_seconds is not None and app.measured_at is not None:
        elapsed = (now - app.measured_at).total_seconds()
        if elapsed > 0:
            percent = max(0.0, (cpu - app.cpu_seconds) / elapsed * 100)
    SparkApplication.objects.filter(pk=app.pk).update(
        rss_bytes=rss, cpu_seconds=cpu, cpu_percent=percent, measured_at=now
    )


def _ended(app: SparkApplication, report: dict | None, now: datetime):
    """Its process is gone: record why, decide what comes next; the members to end."""
    code = report.get("exit_code") if report else None
    error = (report or {}).get("error_tail", "") or "the application's process is gone"
    placed = list(members(app))
    if app.status == ApplicationStatus.RECYCLING:
        action, cause, changes = "recycled", EndCause.RECYCLED, {"next_attempt_at": now}
        status = ApplicationStatus.RESTARTING
    elif app.desired_state != DesiredState.RUNNING or app.status == ApplicationStatus.STOPPING:
        action, cause, changes = "stopped", EndCause.APPLICATION_LOST, {"next_attempt_at": None}
        status = ApplicationStatus.STOPPED
    else:
        attempt = app.attempt + 1
        if app.ready_at is not None and now - app.ready_at > RESET_AFTER:
            attempt = 1
        action, cause = "lost", EndCause.APPLICATION_LOST
        changes = {"attempt": attempt, "next_attempt_at": now + backoff(attempt)}
        changes["restarts"] = F("restarts") + 1
        status = ApplicationStatus.RESTARTING
        log.warning(
            "application %s: its process ended (exit %s) with %d members: %s",
            app.name, code, len(placed), error[-300:],
        )  # fmt: skip
    _set(
        app,
        status=status,
        pid=None,
        process_started=None,
        last_exit_code=code,
        last_exit_at=now,
        last_error=error[-8000:],
        recycle_requested_at=None,
        stop_requested_at=None,
        rss_bytes=None,
        cpu_percent=None,
        cpu_seconds=None,
        **changes,
    )
    return action, placed, cause, f"application {app.name!r} ended: {error[-2000:]}"


def _end_members(placed: list[Run], cause: str, error: str, now: datetime) -> None:
    """End the runs of an application whose process is gone, each under its pipeline's lock
    (taken after the application's was released): by its own exit report where the
    application wrote one, else with the cause it was being killed for, else `cause`."""
    for run in placed:
        if not _recorded_exit(run, now):
            endings.finish(
                run,
                now,
                exit_code=None,
                cause=run.end_cause or cause,
                error=run.error_tail or error,
            )


def _recorded_exit(run: Run, now: datetime) -> bool:
    """Record the run's end from the exit report its application wrote, if there is one."""
    report = launcher.exit_report(run)
    if report is None:
        return False
    endings.record_exit(
        run,
        now,
        exit_code=report.get("exit_code"),
        error=report.get("error_tail", ""),
        failure=report.get("failure"),  # the member's verdict (jobs.host: by type)
    )
    return True


def _running(app: SparkApplication, now: datetime) -> str | None:
    if app.status == ApplicationStatus.RECYCLING:
        return "recycling"
    if app.desired_state != DesiredState.RUNNING:
        if app.status != ApplicationStatus.STOPPING:
            launcher.request_application_stop(app)
            _set(app, status=ApplicationStatus.STOPPING, stop_requested_at=now)
            return "stop"
        if now - app.stop_requested_at > timedelta(seconds=settings.CONTROLPLANE_STOP_TIMEOUT):
            launcher.kill_application(app)
            return "kill"
        return None
    if app.status == ApplicationStatus.STARTING:
        if launcher.application_ready(app):
            _set(app, status=ApplicationStatus.RUNNING, ready_at=now, status_message="")
            return "ready"
        grace = timedelta(seconds=settings.CONTROLPLANE_STARTUP_GRACE)
        if app.started_at and now - app.started_at > grace:
            log.warning("application %s: not up within %s; killing it", app.name, grace)
            launcher.kill_application(app)
            return "kill"
    return None


def _not_running(app: SparkApplication, now: datetime, *, placed: bool = False) -> str | None:
    if app.desired_state != DesiredState.RUNNING:
        if app.status != ApplicationStatus.STOPPED:
            _set(app, status=ApplicationStatus.STOPPED, next_attempt_at=None)
            return "settle"
        return None
    if app.status == ApplicationStatus.STARTING:
        # A launch that never completed (its worker died): what it started is killed, and it
        # counts as a loss.
        if app.started_at and now - app.started_at > LAUNCH_GRACE:
            launcher.kill_application(app)
            _set(app, status=ApplicationStatus.RESTARTING, next_attempt_at=now)
            return "launch-lost"
        return None
    if app.next_attempt_at and now < app.next_attempt_at:
        return None
    if not placed:
        target, waiting = hosts.choose(now)
        if target is None:
            if app.status_message != waiting:
                _write(app.pk, {"generation": app.generation}, status_message=waiting)
            return None
        if target != hosts.here():
            return hosts.route_application(target, app.pk)
    changes = {
        "generation": app.generation + 1,
        "status": ApplicationStatus.STARTING,
        "started_at": now,
        "ready_at": None,
        "next_attempt_at": None,
        "stop_requested_at": None,
        "recycle_requested_at": None,
    }
    token = launcher.prepare_application(app, changes["generation"])
    if not _set(app, **changes, app_dir=app.app_dir, host=app.host, token_digest=app.token_digest):
        return None
    app._token = token
    return "launch"


def _launch(app: SparkApplication, now: datetime) -> str:
    """Start the process of the generation just recorded (outside the row lock)."""
    try:
        launcher.launch_application(app, app._token)
    except Exception as exc:
        log.exception("application %s: launch failed", app.name)
        attempt = app.attempt + 1
        _write(
            app.pk,
            {"generation": app.generation, "pid": None},
            status=ApplicationStatus.RESTARTING,
            attempt=attempt,
            next_attempt_at=now + backoff(attempt),
            last_error=str(exc)[-8000:],
        )
        return "launch-failed"
    updated = SparkApplication.objects.filter(
        pk=app.pk, generation=app.generation, status=ApplicationStatus.STARTING, pid__isnull=True
    ).update(pid=app.pid, process_started=app.process_started)
    if not updated:
        launcher.kill_application(app)  # given up on meanwhile
        return "launch-aborted"
    log.info(
        "application %s: process %s started (generation %s)", app.name, app.pid, app.generation
    )
    return "launch"


def _recycle(app: SparkApplication, now: datetime) -> None:
    """Stop every member that can stop gracefully; once only the stuck ones are left (or
    the stop timeout has passed), kill the process (the next tick sees it gone)."""
    waiting = False

    for run in members(app):
        if _recorded_exit(run, now):  # stopped already, not yet recorded
            continue
        if run.kill_requested_at is not None:
            continue  # stuck: ends with the process
        if run.stop_requested_at is None:
            launcher.request_stop(run)
            Run.objects.filter(pk=run.pk, state__in=RunState.active()).update(
                state=RunState.STOPPING, stop_requested_at=now, end_cause=EndCause.RECYCLED
            )
            log.info("application %s: stopping %s for the recycle", app.name, run)
        waiting = True
    timeout = timedelta(seconds=settings.CONTROLPLANE_STOP_TIMEOUT)
    if waiting and app.recycle_requested_at and now - app.recycle_requested_at <= timeout:
        return
    log.warning("application %s: killing its process for the recycle", app.name)
    launcher.kill_application(app)


def stopped_with_host(app: SparkApplication) -> None:
    """Its process was stopped with the stack (`stop_drivers`): not a loss; it is started
    again, as desired, with the stack."""
    _write(
        app.pk,
        {"generation": app.generation},
        status=ApplicationStatus.STOPPED,
        pid=None,
        process_started=None,
        next_attempt_at=None,
    )
