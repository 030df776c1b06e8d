"""The overview's rows: every pipeline's live figures, problems first."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from controlplane.definitions.models import Pipeline, Status
from controlplane.observability import metrics
from controlplane.observability.kafka_lookups import KafkaLookups

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
# A word and a symbol with every colour, so that status never depends on colour alone.
STATUS_SYMBOLS = {
    Status.RUNNING: "●",
    Status.STARTING: "◔",
    Status.RESTARTING: "↻",
    Status.BACKING_OFF: "↻",
    Status.STOPPING: "◌",
    Status.STOPPED: "■",
    Status.SUSPENDED: "⏸",
    Status.FAILED: "✖",
}


@dataclass
class Row:
    pipeline: Pipeline
    severity: int
    why: str
    figures: dict

    @property
    def severity_name(self) -> str:
        return SEVERITY_NAMES[self.severity]

    @property
    def symbol(self) -> str:
        return STATUS_SYMBOLS.get(self.pipeline.status, "?")


def classify(pipeline: Pipeline, figures: dict) -> tuple[int, str]:
    status = pipeline.status
    lag = figures["lag"]
    pressure = figures["backpressure"]
    if status == Status.FAILED:
        return FAILING, "failed: gave up restarting"
    if status in (Status.BACKING_OFF, Status.RESTARTING, Status.STARTING):
        return RECOVERING, f"{pipeline.get_status_display().lower()} (attempt {pipeline.attempt})"
    if status == Status.RUNNING:
        if lag.get("error"):
            return DEGRADED, lag["error"]
        if lag.get("status") in ("stalled", "lagging"):
            return DEGRADED, f"lag {lag['status']}"
        if pressure.get("level") == "high":
            return DEGRADED, "high backpressure"
        return HEALTHY, "ok"
    return QUIET, pipeline.get_status_display().lower()


def rows(now: datetime, *, query: str = "", show: str = "all") -> list[Row]:
    pipelines = Pipeline.objects.order_by("name")
    if query:
        pipelines = pipelines.filter(name__icontains=query.strip())
    lookups = KafkaLookups()  # one Kafka lookup per topic for the whole page
    out = []
    for pipeline in pipelines:
        figures = metrics.pipeline_metrics(pipeline, now, lookups)
        severity, why = classify(pipeline, figures)
        out.append(Row(pipeline, severity, why, figures))
    wanted = FILTERS.get(show)
    if wanted is not None:
        out = [r for r in out if r.severity in wanted]
    out.sort(key=lambda r: (r.severity, r.pipeline.name))
    return out
