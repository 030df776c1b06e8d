"""Which pipelines the reconcile tick visits: only those that may need a step.

Visiting a pipeline (its row lock, its run, its supervisor's process, its exit report) costs
about 2 ms; visiting all of them made the tick take 2 s at 1,000 healthy pipelines, and most
visits did nothing. The tick asks instead, in two queries and one look at this host's
process table, which pipelines are not at rest:

- without an active run: any whose (status, desired state) the transition table would change
  (`transitions.at_rest`), a restart whose stored time (`next_attempt_at`) has come, and a
  stale restart time left on a pipeline at rest;
- with an active run on this host: any run starting, stopping or being killed; of a
  pipeline that no longer wants it (stopped, suspended, restarted by hand); whose pipeline
  carries a message to revisit; whose heartbeats or batches are overdue (the same rules as
  the reconciler's, `silence`, without the allowance for a deaf control plane, which only
  ever spares a run); whose supervisor is gone or whose exit report is written.

Runs on other hosts are visited by those hosts' own ticks (the coordinator's tick only
visits them once their host is lost). A pipeline left out is one whose step would do nothing;
tests/test_attention.py checks that against `reconcile_pipeline` itself. Operators' commands
and drivers' exit reports do not wait for the tick: they reconcile their pipeline at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from controlplane.definitions.models import DesiredState, Pipeline, Run, RunState, Status

from . import hosts, launcher, silence, transitions


def pipelines_to_visit(now: datetime, *, coordinator: bool = True) -> list[tuple[int, str]]:
    """(id, name) of every pipeline the tick must visit now, by name. A host's own tick
    (not the `coordinator`'s) visits only runs on its host; the coordinator's also the
    pipelines without a run (it places their next driver) and the runs of lost hosts."""
    found = dict(_idle_to_visit(now)) if coordinator else {}
    found.update(_running_to_visit(now, coordinator=coordinator))
    return sorted(found.items(), key=lambda item: item[1])


def _idle_to_visit(now: datetime) -> list[tuple[int, str]]:
    resting = Q(pk__in=[])  # matches nothing
    settled = Q(pk__in=[])
    for status in Status.values:
        for desired in DesiredState.values:
            rest = transitions.at_rest(status, desired)
            if rest is transitions.Rest.ALWAYS:
                resting |= Q(status=status, desired_state=desired)
            elif rest is transitions.Rest.UNLESS_RESTART_PENDING:
                settled |= Q(status=status, desired_state=desired)
    waiting = Q(
        status=Status.BACKING_OFF,
        desired_state=DesiredState.RUNNING,
        next_attempt_at__gt=now,
    )
    quiet = resting | (settled & Q(next_attempt_at=None)) | waiting
    active = Run.objects.filter(pipeline=OuterRef("pk"), state__in=RunState.active())
    return list(Pipeline.objects.filter(~Exists(active)).exclude(quiet).values_list("id", "name"))


def _running_to_visit(now: datetime, *, coordinator: bool) -> list[tuple[int, str]]:
    here = hosts.here()
    lost: dict[str, bool] = {}
    timeout = timedelta(seconds=settings.CONTROLPLANE_HEARTBEAT_TIMEOUT)
    grace = timedelta(seconds=settings.CONTROLPLANE_STARTUP_GRACE)
    rows = Run.objects.filter(state__in=RunState.active()).values(
        "pipeline_id",
        "pipeline__name",
        "pipeline__desired_state",
        "pipeline__generation",
        "pipeline__status_message",
        "pipeline__spec__trigger__interval_seconds",
        "generation",
        "state",
        "host",
        "pid",
        "process_started",
        "run_dir",
        "kill_requested_at",
        "started_at",
        "last_heartbeat_at",
        "last_batch_at",
        "last_idle_at",
    )
    out = []
    alive: dict[tuple, bool] = {}  # a shared application's supervisor is asked once
    for row in rows:
        if row["host"] and row["host"] != here:
            # Another host's tick looks after it, unless that host is lost.
            if coordinator:
                if row["host"] not in lost:
                    lost[row["host"]] = hosts.is_lost(row["host"], now)
                if lost[row["host"]]:
                    out.append((row["pipeline_id"], row["pipeline__name"]))
            continue
        visit = (
            row["state"] != RunState.RUNNING
            or row["kill_requested_at"] is not None
            or row["pipeline__desired_state"] != DesiredState.RUNNING
            or row["pipeline__generation"] != row["generation"]
            or bool(row["pipeline__status_message"])
            or silence.heartbeat_overdue(
                started_at=row["started_at"],
                last_heartbeat_at=row["last_heartbeat_at"],
                now=now,
                timeout=timeout,
                grace=grace,
            )
            is not None
            or silence.stalled(
                started_at=row["started_at"],
                last_batch_at=row["last_batch_at"],
                last_idle_at=row["last_idle_at"],
                now=now,
                window=silence.stall_window(
                    settings.CONTROLPLANE_STALL_SECONDS,
                    _trigger(row["pipeline__spec__trigger__interval_seconds"]),
                ),
                grace=grace,
            )
            is not None
            or bool(row["run_dir"] and launcher.exit_reported(row["run_dir"]))
        )
        if not visit and row["pid"]:
            key = (row["pid"], row["process_started"])
            if key not in alive:
                probe = Run(pid=row["pid"], process_started=row["process_started"], host=here)
                alive[key] = launcher.alive(probe) is not False
            visit = not alive[key]
        if visit:
            out.append((row["pipeline_id"], row["pipeline__name"]))
    return out


def _trigger(interval) -> float:
    """The spec's trigger interval as `Pipeline.trigger_seconds` reads it."""
    return 1.0 if interval is None else float(interval)
