"""The facts of the state-growth rule: each stateful operator's rows and size over a window,
read from what is stored (`StateSample` per batch, `StateRollup` per hour before the raw
retention), at a bounded cost whatever the batch rate.

Raw samples are not read whole (a 1 s trigger makes 86,400 of them a day per operator): the
window is probed at PROBES evenly spaced instants, each taking the operator's last sample
within the step before it (one index lookup each: `state_sample_series`), as a scraper
sampling the series would. Hours already rolled up give one point each, their mean. What
`state_growth.assess` decides from them is in its docstring.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection

from controlplane.definitions.models import StateOperator, StateRollup, StateSample

from .state_growth import OperatorSeries, Sample, Trend, assess

PROBES = 120  # instants per window and operator
DEFAULT_HOURS = 6.0  # the trend's window where no state-growth rule says otherwise


def series(
    now: datetime, windows: list[timedelta], pipeline_ids=None
) -> dict[int, tuple[OperatorSeries, ...]]:
    """Each stateful pipeline's operators' samples over each of `windows` (ending `now`),
    merged: PROBES per window, so a short window is sampled as densely as a long one.
    `pipeline_ids`: only these (None: every pipeline with state)."""
    operators = StateOperator.objects.all()
    if pipeline_ids is not None:
        operators = operators.filter(pipeline_id__in=list(pipeline_ids))
    names = {
        (p, o): name for p, o, name in operators.values_list("pipeline_id", "operator", "name")
    }
    if not names or not windows:
        return {}
    found: dict[tuple[int, int], dict[datetime, Sample]] = {key: {} for key in names}
    for window in sorted(set(windows)):
        for key, sample in _probes(list(names), now, window):
            found[key][sample.at] = sample
    longest = max(windows)
    oldest_raw = {key: min(samples) for key, samples in found.items() if samples}
    rollups = StateRollup.objects.filter(
        pipeline_id__in={p for p, _ in names}, bucket_start__gte=now - longest - timedelta(hours=1)
    ).values_list(
        "pipeline_id", "operator", "bucket_start", "batches", "sum_rows", "sized_batches",
        "sum_size_bytes",
    )  # fmt: skip
    for pipeline_id, operator, start, batches, rows, sized, size in rollups:
        key = (pipeline_id, operator)
        middle = start + timedelta(minutes=30)
        if key not in found or not batches or middle < now - longest:
            continue
        if key in oldest_raw and start + timedelta(hours=1) > oldest_raw[key]:
            continue  # the raw samples cover this hour
        found[key][middle] = Sample(
            at=middle, rows=round(rows / batches), size_bytes=round(size / sized) if sized else None
        )
    out: dict[int, list[OperatorSeries]] = {}
    for (pipeline_id, operator), samples in sorted(found.items()):
        out.setdefault(pipeline_id, []).append(
            OperatorSeries(
                operator=operator,
                name=names[(pipeline_id, operator)],
                samples=tuple(samples[at] for at in sorted(samples)),
            )
        )
    return {pipeline_id: tuple(ops) for pipeline_id, ops in out.items()}


def _probes(keys: list[tuple[int, int]], now: datetime, window: timedelta):
    """(key, sample) of the last raw sample within the step before each probe instant."""
    step = window / PROBES
    table = StateSample._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT w.pipeline_id, w.operator, s.at, s.rows, s.size_bytes
            FROM unnest(%s::bigint[], %s::int[]) AS w(pipeline_id, operator)
            CROSS JOIN generate_series(%s::timestamptz, %s::timestamptz, %s::interval) AS t(at)
            CROSS JOIN LATERAL (
                SELECT x.at, x.rows, x.size_bytes FROM {table} x
                WHERE x.pipeline_id = w.pipeline_id AND x.operator = w.operator
                  AND x.at <= t.at AND x.at > t.at - %s::interval AND x.rows IS NOT NULL
                ORDER BY x.at DESC LIMIT 1
            ) s
            """,  # noqa: S608 - the table name is the model's, the values are parameters
            [
                [p for p, _ in keys],
                [o for _, o in keys],
                now - window + step,
                now,
                step,
                step,
            ],
        )
        for pipeline_id, operator, at, rows, size in cursor.fetchall():
            yield (pipeline_id, operator), Sample(at=at, rows=rows, size_bytes=size)


def trends(pipeline_id: int, now: datetime, hours: float = DEFAULT_HOURS) -> dict[int, Trend]:
    """Each of a pipeline's current operators' growth over the last `hours`."""
    window = timedelta(hours=hours)
    found = series(now, [window], [pipeline_id]).get(pipeline_id, ())
    return {s.operator: assess(s.samples, now, window) for s in found}
