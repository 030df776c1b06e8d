"""Storing the batch progress drivers report (Spark's StreamingQueryProgress, camelCase)."""

from __future__ import annotations

import json

from django.utils.dateparse import parse_datetime

from controlplane.definitions.models import BatchProgress, Run

from . import state


def store(run: Run, reports: list[dict]) -> None:
    """One row per batch; a retried request repeats batches already stored: ignored."""
    store_many([(run, reports)])


def store_many(reports: list[tuple[Run, list[dict]]]) -> None:
    """`store` for many runs' reports, in one statement (and, for batches of stateful
    operators, their state: `controlplane.observability.state`)."""
    pairs = [(run, p) for run, batches in reports for p in batches]
    rows = [_progress_row(run, p) for run, p in pairs]
    if rows:
        BatchProgress.objects.bulk_create(rows, ignore_conflicts=True)
        # reported_at was set on each row as it was inserted (auto_now_add).
        state.store([(run, p, row.reported_at) for (run, p), row in zip(pairs, rows, strict=True)])


def _progress_row(run: Run, p: dict) -> BatchProgress:
    source = (p.get("sources") or [{}])[0]
    operators = p.get("stateOperators") or []
    return BatchProgress(
        run=run,
        batch_id=p["batchId"],
        timestamp=p["timestamp"],
        num_input_rows=p["numInputRows"],
        input_rows_per_second=p.get("inputRowsPerSecond"),
        processed_rows_per_second=p.get("processedRowsPerSecond"),
        batch_duration_ms=p.get("batchDuration"),
        durations_ms=p.get("durationMs", {}),
        end_offsets=_offsets(source.get("endOffset")),
        latest_offsets=_offsets(source.get("latestOffset")),
        state_rows=_total(operators, "numRowsTotal"),
        state_memory_bytes=_total(operators, "memoryUsedBytes"),
        watermark=_watermark(p.get("eventTime") or {}),
    )


def _total(operators: list[dict], key: str) -> int | None:
    values = [o[key] for o in operators if isinstance(o.get(key), int)]
    total = sum(values)
    return total if values and total < 2**63 else None  # (a BIGINT column)


def _watermark(event_time: dict):
    """Spark reports the watermark as ISO text; the epoch (no watermark yet) is left out."""
    try:
        value = parse_datetime(str(event_time.get("watermark") or ""))
    except ValueError:
        return None
    if value is None or value.timestamp() <= 0:
        return None
    return value


def _offsets(value):
    """Spark reports source offsets as JSON text; keep the per-topic offsets as JSON (keys
    starting with `$` are the source's own bookkeeping, such as a batch's split plan)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not str(k).startswith("$")}
    return value
