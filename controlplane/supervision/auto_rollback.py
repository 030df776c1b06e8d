"""Automatic rollback (beat, every 30 s): a pipeline with `auto_rollback_minutes` set whose
current spec version is a bad deploy (`deploys.verdict`) is rolled back to the newest
earlier version that ran healthy (one of its runs committed a batch), with `controls.rollback`
(audited as the system's, the reason saying why; a running pipeline restarts to run it).
`auto_rolled_back_at` and `auto_rollback_note` say what happened, for the page and the
`rolled-back` alert rule."""

from __future__ import annotations

import logging
from datetime import datetime

from django.db.models import Max

from controlplane.definitions import services
from controlplane.definitions.models import (
    Failure,
    Pipeline,
    PipelineFigures,
    Run,
    RunState,
    Status,
)
from jobs.spec import SpecError

from . import controls, deploys

log = logging.getLogger("controlplane.auto_rollback")


def facts(pipeline: Pipeline) -> deploys.VersionFacts | None:
    runs = Run.objects.filter(pipeline=pipeline, spec_version=pipeline.version)
    first = runs.order_by("generation").first()
    if first is None:
        return None
    last = Run.objects.filter(pipeline=pipeline).order_by("-generation").first()
    figures = PipelineFigures.objects.filter(pipeline=pipeline).only("lag_seconds").first()
    running = last.state == RunState.RUNNING and last.spec_version == pipeline.version
    return deploys.VersionFacts(
        version=pipeline.version,
        started=first.started_at is not None,
        committed=runs.filter(last_batch_id__isnull=False).exists(),
        failures=Failure.objects.filter(
            pipeline=pipeline, run__spec_version=pipeline.version
        ).count(),
        gave_up=pipeline.status == Status.FAILED and last.spec_version == pipeline.version,
        running_since=last.started_at if running else None,
        waiting_seconds=figures.lag_seconds if figures else None,
    )


def healthy_version(pipeline: Pipeline) -> int | None:
    """The newest earlier version one of whose runs committed a batch."""
    return (
        Run.objects.filter(
            pipeline=pipeline, spec_version__lt=pipeline.version, last_batch_id__isnull=False
        )
        .aggregate(newest=Max("spec_version"))
        .get("newest")
    )


def check(now: datetime) -> dict:
    rolled, refused = [], []
    for pipeline in Pipeline.objects.filter(auto_rollback_minutes__isnull=False, version__gt=1):
        found = facts(pipeline)
        if found is None:
            continue
        why = deploys.verdict(found, pipeline.auto_rollback_minutes, now)
        if why is None:
            continue
        target = healthy_version(pipeline)
        if target is None:
            continue  # nothing earlier ever ran healthy: nothing to go back to
        target_spec = pipeline.versions.filter(version=target).values_list("spec", flat=True)
        if target_spec.first() == pipeline.spec:
            continue  # it is that spec already (rolled back before): nothing to gain
        reason = f"automatic: {why}"
        try:
            after = controls.rollback(pipeline, target, user=None, reason=reason, now=now)
        except (SpecError, services.Invalid, services.Conflict) as exc:
            note = f"version {pipeline.version} is a bad deploy ({why}), but version {target}"
            note += f" cannot come back: {exc}"
            if pipeline.auto_rollback_note != note:
                Pipeline.objects.filter(pk=pipeline.pk).update(auto_rollback_note=note)
                log.warning("pipeline %s: %s", pipeline.name, note)
            refused.append(pipeline.name)
            continue
        note = f"rolled back from version {found.version} to version {target}'s spec"
        note += f" (now version {after.version}): {why}"
        Pipeline.objects.filter(pk=pipeline.pk).update(
            auto_rolled_back_at=now, auto_rollback_note=note
        )
        log.warning("pipeline %s: %s", pipeline.name, note)
        rolled.append(pipeline.name)
    return {"rolled_back": rolled, "refused": refused}
