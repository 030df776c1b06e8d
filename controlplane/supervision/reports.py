"""What drivers' reports mean for their runs: fencing, liveness, and the answer they get.

Reports are fenced: only the pipeline's current, still-active run is heard; anything else (a
driver the control plane already gave up on, a zombie from an older generation) is told to
stop. The HTTP side (run-token authentication, validation) is controlplane.api.reports.
"""

from __future__ import annotations

from datetime import datetime

from controlplane.definitions.models import DesiredState, Run, RunState

STALE = {"detail": "stale run: this driver is not the pipeline's current run", "stop": True}


def is_current(run: Run) -> bool:
    """Whether the run is its pipeline's current, still-active one (run.pipeline as loaded
    with the run, in this request)."""
    return run.generation == run.pipeline.generation and run.state in RunState.active()


def answer(run: Run) -> dict:
    """What a heard driver is told: whether to stop gracefully, and its generation."""
    pipeline = run.pipeline
    stop = pipeline.desired_state != DesiredState.RUNNING or run.stop_requested_at is not None
    return {"stop": stop, "generation": run.generation}


def heartbeat(run: Run, now: datetime, *, idle: bool) -> None:
    """A sign of life; `idle`: its query waits for data, it is not stuck."""
    changes = {"last_heartbeat_at": now}
    if idle:
        changes["last_idle_at"] = now
    Run.objects.filter(pk=run.pk).update(**changes)


def batches_completed(run: Run, last_batch_id: int, now: datetime) -> None:
    """Progress came: the run is alive and its query moves."""
    Run.objects.filter(pk=run.pk).update(
        last_heartbeat_at=now, last_batch_id=last_batch_id, last_batch_at=now
    )
