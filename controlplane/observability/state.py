"""State you can see: what stateful operators (windowed aggregations, deduplication) keep,
from the `stateOperators` of the batch progress drivers report.

Per pipeline, operator (its index in the query's `stateOperators`, with Spark's
operatorName) and batch: rows held, updated and removed, memory used, size (RocksDB: its SST
files on disk; Spark's default HDFS-backed store: its current version, in memory), late rows
dropped by the watermark, the state's commit time and the batch's checkpoint time; and
which store keeps it, deduced from the custom metrics reported (Spark does not say).
`StateSample` rows are kept as long as raw progress, then rolled up per hour (`rollup`,
from `retention`); `StateOperator` holds each operator's latest figures and its total of
late rows dropped.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.db.models.functions import Coalesce, TruncHour

from controlplane.definitions.models import (
    Pipeline,
    Run,
    StateOperator,
    StateRollup,
    StateSample,
    StateStore,
)

# The figures a sample keeps (StateSample's columns, StateOperator.latest's keys).
FIGURES = (
    "rows",
    "rows_updated",
    "rows_removed",
    "memory_bytes",
    "size_bytes",
    "rows_dropped",
    "commit_ms",
    "checkpoint_ms",
    "store_checkpoint_ms",
)


def store_of(custom_metrics: dict) -> str:
    """RocksDB reports rocksdb* metrics; the HDFS-backed store its loaded maps and the size
    of its current version."""
    names = set(custom_metrics or {})
    if any(n.startswith("rocksdb") for n in names):
        return StateStore.ROCKSDB
    if "stateOnCurrentVersionSizeBytes" in names or any(
        n.startswith("loadedMapCache") for n in names
    ):
        return StateStore.HDFS
    return StateStore.UNKNOWN


def size_in(store: str) -> str | None:
    """Where an operator's reported size is: on disk (RocksDB), in memory (HDFS-backed)."""
    return {StateStore.ROCKSDB: "disk", StateStore.HDFS: "memory"}.get(store)


def figures_of(operator: dict, durations: dict) -> dict:
    """One StateOperatorProgress (validated, camelCase) and its batch's durationMs: the
    figures kept."""
    custom = operator.get("customMetrics") or {}
    store = store_of(custom)
    if store == StateStore.ROCKSDB:
        size = custom.get("rocksdbSstFileSize")
    else:
        size = custom.get("stateOnCurrentVersionSizeBytes")
    wal, offsets = _duration(durations, "walCommit"), _duration(durations, "commitOffsets")
    return {
        "name": operator.get("operatorName") or "",
        "store": store,
        "rows": operator.get("numRowsTotal"),
        "rows_updated": operator.get("numRowsUpdated"),
        "rows_removed": operator.get("numRowsRemoved"),
        "memory_bytes": operator.get("memoryUsedBytes"),
        "size_bytes": size,
        "rows_dropped": operator.get("numRowsDroppedByWatermark"),
        "commit_ms": operator.get("commitTimeMs"),
        "checkpoint_ms": None if wal is None and offsets is None else (wal or 0) + (offsets or 0),
        "store_checkpoint_ms": custom.get("rocksdbCommitCheckpointLatency"),
    }


def _duration(durations: dict, key: str) -> int | None:
    """A batch's phase in ms; None when absent or impossible (durationMs is not bounded by
    the report API: a negative or gigantic figure is not kept)."""
    value = durations.get(key)
    return value if isinstance(value, int) and 0 <= value < 2**62 else None


def store(batches: list[tuple[Run, dict, datetime]]) -> None:
    """Keep the state operators of reported batches, (run, progress, reported_at) each: a
    sample per operator and batch (a repeated batch is ignored), and each operator's
    latest figures and total of late rows (a batch counts once: only batches newer than
    the last one counted move them). Batches without state cost nothing."""
    stateful = [(run, p, at) for run, p, at in batches if p.get("stateOperators")]
    if not stateful:
        return
    samples = []
    for run, p, at in stateful:
        durations = p.get("durationMs") or {}
        for index, operator in enumerate(p["stateOperators"]):
            samples.append(
                StateSample(
                    pipeline_id=run.pipeline_id,
                    run=run,
                    batch_id=p["batchId"],
                    operator=index,
                    at=at,
                    **figures_of(operator, durations),
                )
            )
    with transaction.atomic():
        StateSample.objects.bulk_create(samples, ignore_conflicts=True)
        _update_operators(stateful)


def _update_operators(stateful: list[tuple[Run, dict, datetime]]) -> None:
    pipelines = sorted({run.pipeline_id for run, _, _ in stateful})
    # Locked in one order: two requests never wait on each other's rows crosswise.
    existing = {
        (row.pipeline_id, row.operator): row
        for row in StateOperator.objects.select_for_update()
        .filter(pipeline_id__in=pipelines)
        .order_by("pk")
    }
    created, changed = {}, set()
    newest: dict[int, tuple[int, int]] = {}  # pipeline: (run, operators) of its newest batch
    for run, p, at in sorted(stateful, key=lambda b: (b[0].pk, b[1]["batchId"])):
        batch = p["batchId"]
        operators = p["stateOperators"]
        newest[run.pipeline_id] = (run.pk, len(operators))
        durations = p.get("durationMs") or {}
        for index, operator in enumerate(operators):
            key = (run.pipeline_id, index)
            figures = figures_of(operator, durations)
            row = existing.get(key)
            if row is None:
                row = existing[key] = created[key] = StateOperator(
                    pipeline_id=run.pipeline_id, operator=index, batch_id=-1, at=at
                )
                row.name = figures["name"]
            elif (row.run_id or 0, row.batch_id) >= (run.pk, batch):
                continue  # counted already (a retry), or older than what is shown
            if row.name != figures["name"]:
                # Another operator at this index (the query's shape changed): its own total.
                row.name, row.rows_dropped_total = figures["name"], 0
            row.store = figures["store"]
            row.run_id, row.batch_id, row.at = run.pk, batch, at
            row.latest = {k: figures[k] for k in FIGURES}
            row.rows_dropped_total += figures["rows_dropped"] or 0
            if key not in created:
                changed.add(key)
    # Operators beyond the newest run's: a former query shape's, gone.
    gone = [
        key
        for key, row in existing.items()
        if key[0] in newest and key[1] >= newest[key[0]][1] and row.run_id != newest[key[0]][0]
    ]
    for key in gone:
        created.pop(key, None)
        changed.discard(key)
    StateOperator.objects.filter(pk__in=[existing[k].pk for k in gone if existing[k].pk]).delete()
    if created:
        # A concurrent first report of the same operator may have made it meanwhile.
        StateOperator.objects.bulk_create(created.values(), ignore_conflicts=True)
    if changed:
        StateOperator.objects.bulk_update(
            [existing[k] for k in changed],
            ["name", "store", "run", "batch_id", "at", "latest", "rows_dropped_total"],
        )


def current(pipeline_ids) -> dict[int, list[StateOperator]]:
    """Each pipeline's stateful operators as of its latest run that reported a batch
    (operators of an earlier run whose successor keeps no state are not shown), in order."""
    ids = list(pipeline_ids)
    latest = dict(
        Run.objects.filter(pipeline_id__in=ids, last_batch_id__isnull=False)
        .order_by("pipeline_id", "-generation")
        .distinct("pipeline_id")
        .values_list("pipeline_id", "pk")
    )
    out: dict[int, list[StateOperator]] = {}
    for row in StateOperator.objects.filter(pipeline_id__in=ids).order_by("pipeline", "operator"):
        if row.run_id is not None and row.run_id == latest.get(row.pipeline_id):
            out.setdefault(row.pipeline_id, []).append(row)
    return out


def current_of(pipeline: Pipeline) -> list[dict]:
    """`current` for one pipeline, as the API shows it."""
    return [as_dict(row) for row in current([pipeline.pk]).get(pipeline.pk, [])]


def as_dict(row: StateOperator) -> dict:
    return {
        "operator": row.operator,
        "name": row.name,
        "store": row.store or None,
        "size_in": size_in(row.store),
        "batch_id": row.batch_id,
        "at": _iso(row.at),
        **{k: row.latest.get(k) for k in FIGURES},
        "rows_dropped_total": row.rows_dropped_total,
    }


HISTORY_POINTS = 2_000  # per operator, as metrics.history
MAX_OPERATORS = 64  # per query: what the report API takes


def history(pipeline: Pipeline, since: datetime) -> list[dict]:
    """Each operator's state since `since`, oldest first, for charts: one point per batch
    where samples are kept raw (the newest HISTORY_POINTS of each operator), one per hour
    (means, the hour's maxima, late rows summed) before that. An operator's name and store
    are its newest point's."""
    operators: dict[int, dict] = {}

    def entry(index: int, name: str, store: str) -> dict:
        found = operators.get(index)
        if found is None:
            found = operators[index] = {"operator": index, "points": []}
        found.update(name=name, store=store or None, size_in=size_in(store))
        return found

    raw: dict[int, list[dict]] = {}
    # Operators are numbered from 0 in every batch: one index-backed query each.
    for index in range(MAX_OPERATORS):
        kept = list(
            StateSample.objects.filter(pipeline=pipeline, operator=index, at__gte=since)
            .order_by("-at")
            .values("operator", "name", "store", "at", "batch_id", "run__generation", *FIGURES)[
                :HISTORY_POINTS
            ]
        )
        if not kept:
            break
        raw[index] = kept
    raw_from = {index: kept[-1]["at"] for index, kept in raw.items()}
    rollups = StateRollup.objects.filter(
        pipeline=pipeline, bucket_start__gt=since - timedelta(hours=1)
    ).order_by("operator", "bucket_start")
    for r in rollups:
        start = raw_from.get(r.operator)
        if start is not None and r.bucket_start >= start:
            continue
        entry(r.operator, r.name, r.store)["points"].append(_rollup_point(r))
    for index in sorted(raw):
        kept = list(reversed(raw[index]))
        newest = kept[-1]
        points = entry(index, newest["name"], newest["store"])["points"]
        for row in kept:
            points.append(
                {
                    "at": _iso(row["at"]),
                    "resolution": "batch",
                    "run": row["run__generation"],
                    "batch_id": row["batch_id"],
                    "batches": 1,
                    **{k: row[k] for k in FIGURES},
                    "max_rows": row["rows"],
                    "max_commit_ms": row["commit_ms"],
                }
            )
    return [operators[i] for i in sorted(operators)]


def _rollup_point(r: StateRollup) -> dict:
    n = r.batches or 1
    return {
        "at": _iso(r.bucket_start),
        "resolution": "hour",
        "run": None,
        "batch_id": None,
        "batches": r.batches,
        "rows": r.sum_rows / n,
        "rows_updated": r.sum_rows_updated / n,
        "rows_removed": r.sum_rows_removed / n,
        "memory_bytes": r.sum_memory_bytes / n,
        "size_bytes": r.sum_size_bytes / r.sized_batches if r.sized_batches else None,
        "rows_dropped": r.rows_dropped,
        "commit_ms": r.sum_commit_ms / n,
        "checkpoint_ms": (
            r.sum_checkpoint_ms / r.checkpointed_batches if r.checkpointed_batches else None
        ),
        "store_checkpoint_ms": None,
        "max_rows": r.max_rows,
        "max_commit_ms": r.max_commit_ms,
    }


def rollup(cutoff: datetime) -> int:
    """Roll samples older than `cutoff` up into hourly buckets and delete them, in the
    caller's transaction (retention.compact_progress); how many were rolled up."""
    old = StateSample.objects.filter(at__lt=cutoff)
    buckets = (
        old.annotate(bucket=TruncHour("at"))
        .values("pipeline_id", "operator", "bucket")
        .annotate(
            agg_batches=Count("id"),
            agg_name=Max("name"),
            agg_store=Max("store"),
            agg_rows=Coalesce(Sum("rows"), 0),
            agg_max_rows=Coalesce(Max("rows"), 0),
            agg_updated=Coalesce(Sum("rows_updated"), 0),
            agg_removed=Coalesce(Sum("rows_removed"), 0),
            agg_memory=Coalesce(Sum("memory_bytes"), 0),
            agg_max_memory=Coalesce(Max("memory_bytes"), 0),
            agg_sized=Count("id", filter=Q(size_bytes__isnull=False)),
            agg_size=Coalesce(Sum("size_bytes"), 0),
            agg_max_size=Coalesce(Max("size_bytes"), 0),
            agg_dropped=Coalesce(Sum("rows_dropped"), 0),
            agg_commit=Coalesce(Sum("commit_ms"), 0),
            agg_max_commit=Coalesce(Max("commit_ms"), 0),
            agg_checkpointed=Count("id", filter=Q(checkpoint_ms__isnull=False)),
            agg_checkpoint=Coalesce(Sum("checkpoint_ms"), 0),
            agg_max_checkpoint=Coalesce(Max("checkpoint_ms"), 0),
        )
    )
    rolled = 0
    for b in buckets:
        r, _ = StateRollup.objects.select_for_update().get_or_create(
            pipeline_id=b["pipeline_id"],
            operator=b["operator"],
            bucket_start=b["bucket"],
            bucket_seconds=3600,
        )
        r.name, r.store = b["agg_name"] or r.name, b["agg_store"] or r.store
        r.batches += b["agg_batches"]
        r.sum_rows += b["agg_rows"]
        r.max_rows = max(r.max_rows, b["agg_max_rows"])
        r.sum_rows_updated += b["agg_updated"]
        r.sum_rows_removed += b["agg_removed"]
        r.sum_memory_bytes += b["agg_memory"]
        r.max_memory_bytes = max(r.max_memory_bytes, b["agg_max_memory"])
        r.sized_batches += b["agg_sized"]
        r.sum_size_bytes += b["agg_size"]
        r.max_size_bytes = max(r.max_size_bytes, b["agg_max_size"])
        r.rows_dropped += b["agg_dropped"]
        r.sum_commit_ms += b["agg_commit"]
        r.max_commit_ms = max(r.max_commit_ms, b["agg_max_commit"])
        r.checkpointed_batches += b["agg_checkpointed"]
        r.sum_checkpoint_ms += b["agg_checkpoint"]
        r.max_checkpoint_ms = max(r.max_checkpoint_ms, b["agg_max_checkpoint"])
        r.save()
        rolled += b["agg_batches"]
    old.delete()
    return rolled


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
