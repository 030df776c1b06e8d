"""What drivers' reports mean for their runs: fencing, liveness, and the answer they get.

Reports are fenced: only the pipeline's current, still-active run is heard; anything else (a
driver the control plane already gave up on, a zombie from an older generation) is told to
stop. The HTTP side (run-token authentication, validation) is controlplane.api.reports.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

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


def heard_many(heard: dict[int, tuple[int | None, bool]], now: datetime) -> None:
    """Reports of many runs at once (a shared application's members): for each run id, the
    last batch it completed (None: only a heartbeat) and whether it said it is idle. One
    statement, whatever the number of runs."""
    if not heard:
        return
    table = Run._meta.db_table
    rows = sorted(heard.items())
    values = ", ".join(["(%s::bigint, %s::bigint, %s::boolean)"] * len(rows))
    params = [v for run_id, (batch, idle) in rows for v in (run_id, batch, idle)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {table} AS r SET
                last_heartbeat_at = %s,
                last_batch_id = CASE WHEN v.batch IS NULL THEN r.last_batch_id
                                     ELSE GREATEST(v.batch, COALESCE(r.last_batch_id, v.batch))
                                END,
                last_batch_at = CASE WHEN v.batch IS NULL THEN r.last_batch_at ELSE %s END,
                last_idle_at = CASE WHEN v.idle THEN %s ELSE r.last_idle_at END
            FROM (VALUES {values}) AS v(id, batch, idle)
            WHERE r.id = v.id
            """,  # noqa: S608 - the table name is the model's; every value is a parameter
            [now, now, now, *params],
        )
