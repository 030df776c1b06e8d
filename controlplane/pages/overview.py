"""The overview's rows: every pipeline's stored figures, problems first (or sorted as
asked), a page at a time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.definitions.models import Pipeline, PipelineFigures
from controlplane.observability import health, metrics
from controlplane.observability.assess import assess
from controlplane.observability.health import Health
from controlplane.supervision.explain import Cause

# Severity, highest first: what an on-call engineer must look at before anything else.
FAILING, RECOVERING, DEGRADED, HEALTHY, QUIET = 0, 1, 2, 3, 4
SEVERITY_NAMES = {
    FAILING: "failing",
    RECOVERING: "recovering",
    DEGRADED: "degraded",
    HEALTHY: "healthy",
    QUIET: "stopped",
}
FILTERS = {
    "all": None,
    "problems": {FAILING, RECOVERING, DEGRADED},
    "running": {DEGRADED, HEALTHY},
    "stopped": {QUIET},
}
# A word and a symbol with every colour, so that health never depends on colour alone.
HEALTH_SYMBOLS = {health.RED: "✖", health.AMBER: "▲", health.GREEN: "●", health.GREY: "■"}

SORTS = {
    # name: (label, key over a Row); ties by name
    "severity": ("problems first", lambda r: (r.severity, r.pipeline.name)),
    "name": ("name", lambda r: r.pipeline.name),
    "lag": ("lag (records)", lambda r: (-(r.lag_records or -1), r.pipeline.name)),
    "lag_time": ("lag (time)", lambda r: (-(r.lag_seconds or -1.0), r.pipeline.name)),
    "restarts": ("restarts", lambda r: (-r.pipeline.restarts, r.pipeline.name)),
}
PAGE_SIZE = 50


@dataclass
class Row:
    pipeline: Pipeline
    severity: int
    why: str
    lag_records: int | None
    lag_seconds: float | None
    figures: dict | None = None
    health: Health | None = None
    cause: Cause | None = None

    @property
    def severity_name(self) -> str:
        return SEVERITY_NAMES[self.severity]

    @property
    def health_symbol(self) -> str:
        return HEALTH_SYMBOLS[self.health.colour] if self.health else "?"


@dataclass
class Page:
    rows: list[Row]  # this page's, with their figures
    number: int
    pages: int
    matching: int  # rows that pass the search and filter
    problems: int  # of all pipelines, failing, recovering or degraded
    collected_at: datetime | None  # the oldest figures on this page


# Health (controlplane.observability.health) as the overview's severity groups.
SEVERITY_OF = {
    health.FAILED: FAILING,
    health.CRASH_LOOPING: FAILING,
    health.FAILING: FAILING,
    health.RECOVERING: RECOVERING,
    health.LAGGING: DEGRADED,
    health.DEGRADED: DEGRADED,
    health.HEALTHY: HEALTHY,
    health.STOPPED: QUIET,
}


def rows(
    now: datetime,
    *,
    query: str = "",
    show: str = "all",
    sort: str = "severity",
    page: int = 1,
    page_size: int = PAGE_SIZE,
    labels: list[tuple[str, str]] = (),
) -> Page:
    """One page of the overview from the figures the metrics collector stored: every
    pipeline classified and sorted from a few stored columns (one query), then the full
    figures of the page's rows only (one more)."""
    pipelines = Pipeline.objects.select_related("figures").only(
        "id",
        "name",
        "status",
        "desired_state",
        "attempt",
        "restarts",
        "restarts_since",
        "next_attempt_at",
        "figures__collected_at",
        "figures__lag_records",
        "figures__lag_seconds",
        "figures__lag_status",
        "figures__lag_error",
        "figures__backpressure",
        "figures__last_commit_at",
        "labels",
    )
    for key, value in labels:
        pipelines = pipelines.filter(labels__contains={key: value})
    chosen = list(pipelines.order_by("name"))
    stored_of = {p.pk: p.figures for p in chosen if getattr(p, "figures", None) is not None}
    assessed = assess(chosen, now, stored_of)
    everything = []
    for pipeline in chosen:
        stored = stored_of.get(pipeline.pk)
        judged = assessed[pipeline.pk]
        everything.append(
            Row(
                pipeline,
                SEVERITY_OF[judged.health.state],
                judged.health.why,
                stored.lag_records if stored else None,
                stored.lag_seconds if stored else None,
                health=judged.health,
                cause=judged.cause,
            )
        )
    problems = sum(1 for r in everything if r.severity < HEALTHY)
    found = everything
    if query:
        needle = query.strip().lower()
        found = [r for r in found if needle in r.pipeline.name.lower()]
    wanted = FILTERS.get(show)
    if wanted is not None:
        found = [r for r in found if r.severity in wanted]
    found.sort(key=SORTS.get(sort, SORTS["severity"])[1])
    pages = max(1, -(-len(found) // page_size))
    number = min(max(1, page), pages)
    shown = found[(number - 1) * page_size : number * page_size]
    stored_rows = {
        f.pipeline_id: f
        for f in PipelineFigures.objects.filter(pipeline_id__in=[r.pipeline.pk for r in shown])
    }
    latest = metrics.latest_batches(r.pipeline.pk for r in shown)
    for row in shown:
        pk = row.pipeline.pk
        row.figures = metrics.stored(row.pipeline, now, stored_rows.get(pk), latest.get(pk))
    times = [f.collected_at for f in stored_rows.values()]
    return Page(shown, number, pages, len(found), problems, min(times) if times else None)
