"""Pipelines' health (controlplane.observability.health) and the cause of their last failure,
for many pipelines at once: what the overview, the pipeline page, the API, Prometheus and the
alert rules all show, so that none of them can call a pipeline healthy that another calls
failing.

Read at the time of asking (a few queries whatever the number of pipelines): the pipeline's
status and failures as they are now, the current run's start and last batch, and the lag and
backpressure the metrics collector stored last.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max

from controlplane.definitions.models import (
    DesiredState,
    Failure,
    Pipeline,
    PipelineFigures,
    Run,
    RunState,
)
from controlplane.supervision import explain

from . import health


@dataclass(frozen=True)
class Assessment:
    health: health.Health
    cause: explain.Cause | None  # its last failure's, since its last start by hand
    failure_at: datetime | None
    failure_id: int | None = None  # that failure's row (the exceptions table links to it)

    def as_dict(self) -> dict:
        out = self.health.as_dict()
        out["cause"] = (
            {
                "at": self.failure_at.isoformat() if self.failure_at else None,
                "summary": self.cause.line,
                "category": self.cause.category,
                "title": self.cause.title,
                "fix": self.cause.fix,
            }
            if self.cause is not None
            else None
        )
        return out


def policy() -> health.Policy:
    return health.Policy(
        crash_loop_failures=settings.CONTROLPLANE_CRASH_LOOP_FAILURES,
        crash_loop_minutes=settings.CONTROLPLANE_CRASH_LOOP_MINUTES,
        grace_seconds=settings.CONTROLPLANE_STARTUP_GRACE,
    )


def assess(
    pipelines: list[Pipeline], now: datetime, figures: dict[int, PipelineFigures] | None = None
) -> dict[int, Assessment]:
    """Each pipeline's health and last cause now. `pipelines` need id, status,
    desired_state, attempt and restarts_since; `figures`: their stored figures by pipeline id
    (looked up if not given)."""
    ids = [p.pk for p in pipelines]
    if not ids:
        return {}
    rules = policy()
    if figures is None:
        figures = {f.pipeline_id: f for f in PipelineFigures.objects.filter(pipeline_id__in=ids)}
    runs = {
        row[0]: row[1:]
        for row in Run.objects.filter(pipeline_id__in=ids, state__in=RunState.active())
        .order_by("generation")
        .values_list("pipeline_id", "started_at", "last_batch_at")
    }
    since = now - timedelta(minutes=rules.crash_loop_minutes)
    failed_at: dict[int, list[datetime]] = {}
    for pipeline_id, at in Failure.objects.filter(pipeline_id__in=ids, at__gte=since).values_list(
        "pipeline_id", "at"
    ):
        failed_at.setdefault(pipeline_id, []).append(at)
    last = _last_failures(ids)
    out = {}
    for pipeline in pipelines:
        restarted = pipeline.restarts_since
        failure = last.get(pipeline.pk)
        if failure is not None and restarted is not None and failure.at < restarted:
            failure = None  # before its last start by hand: not what it does now
        cause = (
            explain.recorded(
                failure.cause,
                failure.run.exit_code if failure.run_id else None,
                failure.message if not failure.reason else "",
                failure.reason,
                failure.category,
            )
            if failure is not None
            else None
        )
        stored = figures.get(pipeline.pk)
        started, last_batch = runs.get(pipeline.pk, (None, None))
        commits = [t for t in (_last_commit(stored), last_batch) if t is not None]
        facts = health.Facts(
            status=pipeline.status,
            wanted_running=pipeline.desired_state == DesiredState.RUNNING,
            failures=tuple(
                at for at in failed_at.get(pipeline.pk, ()) if restarted is None or at >= restarted
            ),
            run_started_at=started,
            last_commit_at=max(commits) if commits else None,
            lag_records=stored.lag_records if stored else None,
            lag_status=stored.lag_status if stored else "",
            lag_error=stored.lag_error if stored else "",
            backpressure=stored.backpressure if stored else "",
            last_cause=cause.line if cause else "",
            attempt=pipeline.attempt,
        )
        out[pipeline.pk] = Assessment(
            health.judge(facts, now, rules),
            cause,
            failure.at if failure else None,
            failure.pk if failure else None,
        )
    return out


def assess_one(pipeline: Pipeline, now: datetime) -> Assessment:
    return assess([pipeline], now)[pipeline.pk]


def _last_failures(ids: list[int]) -> dict[int, Failure]:
    """Each pipeline's newest failure (two queries; its message only where no reason was
    recorded: a failure recorded before reasons were)."""
    newest = (
        Failure.objects.filter(pipeline_id__in=ids)
        .values("pipeline_id")
        .annotate(newest=Max("id"))
        .values_list("newest", flat=True)
    )
    rows = Failure.objects.filter(id__in=list(newest)).select_related("run").defer("message")
    return {f.pipeline_id: f for f in rows}


def _last_commit(stored: PipelineFigures | None) -> datetime | None:
    return stored.last_commit_at if stored is not None else None
