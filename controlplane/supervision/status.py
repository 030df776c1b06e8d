"""The one place a pipeline's status is written.

Each change is a step of the transition table (`controlplane.supervision.transitions`), made
with a conditional update: on the status the caller read (under the pipeline's row lock), and
on the run's generation where a run's fate decides it, so a step computed from a stale view
changes nothing.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from controlplane.definitions.models import Pipeline

from .transitions import Observation, Step, step

log = logging.getLogger("controlplane.reconciler")


def transition(
    pipeline: Pipeline, observation: Observation, *, if_generation: int | None = None, **changes
) -> Step | None:
    """Apply the table's step for `observation` to `pipeline` (as read under its lock),
    with `changes` to other fields in the same update. Returns the step, or None when the
    table has none (then only `changes` are written, if any) or the row had moved on."""
    found = step(pipeline.status, pipeline.desired_state, observation)
    rows = Pipeline.objects.filter(pk=pipeline.pk, status=pipeline.status)
    if if_generation is not None:
        rows = rows.filter(generation=if_generation)
    if found is None:
        if changes:
            rows.update(**changes)
        return None
    if not rows.update(status=found.status, updated_at=timezone.now(), **changes):
        log.info("pipeline %s: %s came too late (it moved on)", pipeline.name, observation)
        return None
    if found.status != pipeline.status:
        log.debug(
            "pipeline %s: %s -> %s (%s)", pipeline.name, pipeline.status, found.status, observation
        )
    pipeline.status = found.status
    return found
