"""Prometheus exposition at /metrics (prometheus_client, a custom collector): the same stored
figures as the metrics API, per pipeline, with their age, and each shared Spark application's
state, load and size.

Scraped with an API token (Prometheus: `authorization: {type: Token, credentials: cpt_...}`).
"""

from __future__ import annotations

from django.db.models import Count, F
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controlplane.definitions.models import (
    ApplicationStatus,
    ManagedObject,
    Pipeline,
    PipelineFigures,
    ReconcilerState,
    Run,
    RunState,
    SparkApplication,
    Status,
)

from . import health, metrics
from . import state as state_figures
from .assess import assess

LEVELS = {"ok": 0, "low": 1, "high": 2}
LAG_STATUSES = ("ok", "lagging", "stalled", "stopped")


_FAMILY_TYPES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}
FAMILIES = [
    ("cp_pipeline_status", "gauge", "1 for the pipeline's current status"),
    (
        "cp_pipeline_health",
        "gauge",
        "1 for the pipeline's health (failed, crash-looping, failing, recovering, lagging,"
        " degraded, healthy, stopped: docs/oncall.md)",
    ),
    (
        "cp_pipeline_red",
        "gauge",
        "1 when the pipeline's health is red (failed, crash-looping, failing)",
    ),
    ("cp_pipeline_restarts_total", "counter", "automatic restarts of the pipeline, ever"),
    ("cp_pipeline_restart_attempt", "gauge", "restart attempt under the restart policy"),
    ("cp_lag_records", "gauge", "records in Kafka not yet committed by the pipeline"),
    ("cp_lag_seconds", "gauge", "age of the oldest record not yet processed"),
    ("cp_lag_status", "gauge", "1 for the lag status (ok, lagging, stalled, stopped)"),
    ("cp_partition_lag_records", "gauge", "records not yet committed, per Kafka partition"),
    (
        "cp_time_until_data_loss_seconds",
        "gauge",
        "time until Kafka's retention may delete records the pipeline has not read",
    ),
    (
        "cp_dead_letters",
        "gauge",
        "records that did not parse, in the sink database's dead-letter table now",
    ),
    ("cp_backpressure_busy_ratio", "gauge", "batch duration / trigger interval, recent batches"),
    ("cp_backpressure_level", "gauge", "0 ok, 1 low, 2 high"),
    ("cp_input_rows_per_second", "gauge", "recent input rate"),
    ("cp_processed_rows_per_second", "gauge", "recent processing rate"),
    ("cp_last_commit_age_seconds", "gauge", "seconds since the last committed batch"),
    ("cp_last_batch_id", "gauge", "id of the last committed batch"),
    ("cp_reconciler_last_tick_age_seconds", "gauge", "seconds since the reconcile tick ran"),
    ("cp_figures_age_seconds", "gauge", "age of the pipeline's figures (the collector's round)"),
    (
        "cp_metrics_collected_age_seconds",
        "gauge",
        "seconds since the metrics collector's last round",
    ),
    (
        "cp_pipeline_placement_info",
        "gauge",
        "1: where the pipeline runs (placement as defined; application of its current run)",
    ),
    (
        "cp_state_rows",
        "gauge",
        "rows a stateful operator holds in its state store, as of the last batch (numRowsTotal)",
    ),
    (
        "cp_state_memory_bytes",
        "gauge",
        "memory a stateful operator's state store uses, as of the last batch (memoryUsedBytes)",
    ),
    (
        "cp_state_disk_bytes",
        "gauge",
        "size on disk of a RocksDB state store's SST files, as of the last batch "
        "(rocksdbSstFileSize); none for Spark's default HDFS-backed store, which holds its "
        "state in memory (cp_state_memory_bytes)",
    ),
    (
        "cp_state_commit_ms",
        "gauge",
        "how long the last batch's commit of a stateful operator's state took (commitTimeMs)",
    ),
    (
        "cp_state_rows_dropped_by_watermark_total",
        "counter",
        "late rows a stateful operator dropped as older than the watermark, summed over "
        "every batch reported (numRowsDroppedByWatermark)",
    ),
    ("cp_application_up", "gauge", "1 if the shared Spark application is running"),
    ("cp_application_status", "gauge", "1 for the shared application's current status"),
    ("cp_application_members", "gauge", "pipelines' queries in the shared application now"),
    ("cp_application_capacity", "gauge", "most pipelines' queries the application takes"),
    (
        "cp_application_resident_memory_bytes",
        "gauge",
        "resident memory of the application's process tree on its host",
    ),
    ("cp_application_cpu_percent", "gauge", "CPU of the application's process tree (100: a core)"),
    ("cp_application_restarts_total", "counter", "launches of the application after a loss"),
    (
        "cp_fleet_object_drifted",
        "gauge",
        "1 when an object kept in a fleet's files was changed outside them (as the periodic"
        " drift check last saw it), 0 when it is as last applied",
    ),
]


class StoredFigures:
    """A prometheus_client collector over what the control plane stored: the metrics
    collector's figures per pipeline (with their age), the pipelines' status and restarts,
    the shared applications' state, and the reconcile tick's age. A scrape asks neither
    Kafka nor a checkpoint: a few queries, whatever the number of pipelines."""

    def __init__(self, now):
        self.now = now

    def collect(self):
        families = {}
        for name, kind, help_text in FAMILIES:
            family = _FAMILY_TYPES[kind]
            families[name] = (family, help_text, [])

        def add(name: str, labels: dict, value) -> None:
            if value is not None:
                families[name][2].append((labels, float(value)))

        now = self.now
        placed = dict(
            Run.objects.filter(state__in=RunState.active(), application__isnull=False).values_list(
                "pipeline_id", "application__name"
            )
        )
        stored = {f.pipeline_id: f for f in PipelineFigures.objects.all()}
        latest = metrics.latest_batches(stored)
        names = {}
        pipelines = list(
            Pipeline.objects.order_by("name").only(
                "id", "name", "status", "desired_state", "placement", "restarts", "attempt",
                "restarts_since",
            )
        )  # fmt: skip
        assessed = assess(pipelines, now, stored)
        for pipeline in pipelines:
            names[pipeline.pk] = pipeline.name
            who = {"pipeline": pipeline.name}
            judged = assessed[pipeline.pk].health
            for name in health.STATES:
                add("cp_pipeline_health", {**who, "state": name}, int(judged.state == name))
            add("cp_pipeline_red", who, int(judged.colour == health.RED))
            where = {"placement": pipeline.placement, "application": placed.get(pipeline.pk, "")}
            add("cp_pipeline_placement_info", {**who, **where}, 1)
            for status in Status.values:
                add("cp_pipeline_status", {**who, "status": status}, int(pipeline.status == status))
            add("cp_pipeline_restarts_total", who, pipeline.restarts)
            add("cp_pipeline_restart_attempt", who, pipeline.attempt)
            row = stored.get(pipeline.pk)
            if row is None:
                continue  # not collected yet: no figures rather than made-up ones
            # As the metrics API shows them (the last commit as fresh as the run's row).
            figures = metrics.stored(pipeline, now, row, latest.get(pipeline.pk))
            add("cp_figures_age_seconds", who, figures["age_seconds"])
            lag = figures["lag"]
            add("cp_lag_records", who, lag["records"])
            add("cp_lag_seconds", who, lag["seconds"])
            for status in LAG_STATUSES:
                add("cp_lag_status", {**who, "status": status}, int(lag["status"] == status))
            if lag.get("data_loss"):
                add("cp_time_until_data_loss_seconds", who, lag["data_loss"]["seconds"])
            for p in lag["partitions"]:
                labels = {**who, "topic": p["topic"], "partition": str(p["partition"])}
                add("cp_partition_lag_records", labels, p["lag"])
            add("cp_dead_letters", who, row.dead_letters)
            pressure = figures["backpressure"]
            add("cp_backpressure_busy_ratio", who, pressure["busy_ratio"])
            add("cp_backpressure_level", who, LEVELS[pressure["level"]])
            throughput = figures["throughput"]
            add("cp_input_rows_per_second", who, throughput["input_rows_per_second"])
            add("cp_processed_rows_per_second", who, throughput["processed_rows_per_second"])
            add("cp_last_commit_age_seconds", who, figures["checkpoint"]["age_seconds"])
            add("cp_last_batch_id", who, figures["checkpoint"]["last_batch_id"])
        _state(add, names, state_figures.current(names))
        _applications(add)
        for kind, name, fleet, drifted_at in ManagedObject.objects.order_by(
            "kind", "name"
        ).values_list("kind", "name", "fleet", "drifted_at"):
            who = {"kind": kind, "name": name, "fleet": fleet}
            add("cp_fleet_object_drifted", who, int(drifted_at is not None))
        state = ReconcilerState.objects.filter(id=1).first()
        if state and state.last_tick_at:
            add(
                "cp_reconciler_last_tick_age_seconds",
                {},
                (now - state.last_tick_at).total_seconds(),
            )
        newest = max((f.collected_at for f in stored.values()), default=None)
        if newest is not None:
            add("cp_metrics_collected_age_seconds", {}, (now - newest).total_seconds())
        for name, (family, help_text, samples) in families.items():
            keys = list(dict.fromkeys(k for labels, _ in samples for k in labels))
            metric = family(name, help_text, labels=keys)
            for labels, value in samples:
                metric.add_metric([str(labels.get(k, "")) for k in keys], value)
            yield metric


def exposition(now, *more) -> bytes:
    """The text exposition of the stored figures, and of `more` collectors (the faces add
    the supervision's: controlplane.api.prometheus)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoredFigures(now))
    for collector in more:
        registry.register(collector)
    return generate_latest(registry)


def _state(add, names: dict[int, str], operators: dict) -> None:
    """Each stateful operator's latest figures (StateOperator: one row each, whatever the
    batch rate), labelled by pipeline, operator (its index in the query), operator_name
    (Spark's) and store (rocksdb, hdfs)."""
    for pipeline_id, rows in sorted(operators.items(), key=lambda item: names[item[0]]):
        for row in rows:
            labels = {
                "pipeline": names[pipeline_id],
                "operator": str(row.operator),
                "operator_name": row.name,
                "store": row.store or "unknown",
            }
            latest = row.latest
            add("cp_state_rows", labels, latest.get("rows"))
            add("cp_state_memory_bytes", labels, latest.get("memory_bytes"))
            if state_figures.size_in(row.store) == "disk":
                add("cp_state_disk_bytes", labels, latest.get("size_bytes"))
            add("cp_state_commit_ms", labels, latest.get("commit_ms"))
            add("cp_state_rows_dropped_by_watermark_total", labels, row.rows_dropped_total)


def _applications(add) -> None:
    """Each shared application's state, load and size, as the reconciler last measured it."""
    members = dict(
        Run.objects.filter(
            state__in=RunState.active(), application_generation=F("application__generation")
        )
        .values("application_id")
        .annotate(n=Count("id"))
        .values_list("application_id", "n")
    )
    for app in SparkApplication.objects.order_by("name"):
        who = {"application": app.name}
        add("cp_application_up", who, int(app.status == ApplicationStatus.RUNNING))
        for status in ApplicationStatus.values:
            add("cp_application_status", {**who, "status": status}, int(app.status == status))
        add("cp_application_members", who, members.get(app.pk, 0))
        add("cp_application_capacity", who, app.capacity)
        add("cp_application_resident_memory_bytes", who, app.rss_bytes)
        add("cp_application_cpu_percent", who, app.cpu_percent)
        add("cp_application_restarts_total", who, app.restarts)
