"""One evaluation round of every enabled alert rule (a beat task, apart from the reconcile
tick: alerting never delays supervision). Facts come from what is stored (pipelines, their
runs and failures, the metrics collector's figures, the reconciler's last tick), in a few
queries whatever the number of pipelines. An alert's change and the deliveries it causes are
written in one transaction (an outbox): `delivery` sends them."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max

from controlplane.definitions import services
from controlplane.definitions.models import (
    Failure,
    ManagedObject,
    Pipeline,
    PipelineFigures,
    ReconcilerState,
    Run,
)
from controlplane.observability import assess as assessing
from controlplane.observability import health, writer_schemas

from . import rules, state
from .models import Alert, AlertChannel, AlertDelivery, AlertRule, AlertState, DeliveryStatus
from .state_growth import assess

log = logging.getLogger("controlplane.alerting")

ROUND_LOCK = 0x616C657274  # pg advisory lock: one evaluation round at a time
DEFAULT_FAILURE_WINDOW = timedelta(hours=1)


def evaluate(now: datetime) -> dict:
    """Evaluate every enabled rule for its subjects; returns what changed."""
    summary = {
        "rules": 0, "fired": 0, "repeated": 0, "resolved": 0, "silenced": 0, "suppressed": 0,
    }  # fmt: skip
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ROUND_LOCK])
            if not cursor.fetchone()[0]:
                return {"skipped": "another round is running"}
        enabled = list(AlertRule.objects.filter(enabled=True).prefetch_related("channels"))
        summary["rules"] = len(enabled)
        open_alerts = {
            (a.rule_id, a.subject): a
            for a in Alert.objects.filter(state__in=AlertState.open()).select_related("rule")
        }
        facts = _pipeline_facts(now, enabled) if enabled else {}
        plane = (
            _control_plane_facts()
            if any(not rules.KINDS[r.kind].about_pipelines for r in enabled)
            else None
        )
        budget = ChannelBudget(now)
        seen = set()
        for rule in enabled:
            for subject, pipeline_id, message in _subjects(rule, facts, plane, now):
                seen.add((rule.pk, subject))
                alert = open_alerts.get((rule.pk, subject))
                _apply(rule, subject, pipeline_id, message, alert, now, summary, budget)
        # Open alerts of rules disabled since, or of subjects gone: resolved.
        for key, alert in open_alerts.items():
            if key not in seen:
                _apply(
                    alert.rule, alert.subject, alert.pipeline_id, None, alert, now, summary, budget
                )
    return summary


def _subjects(rule: AlertRule, facts: dict, plane, now: datetime):
    if not rules.KINDS[rule.kind].about_pipelines:
        yield (
            rules.CONTROL_PLANE,
            None,
            rules.control_plane_holds(rule.kind, rule.params, plane, now),
        )
        return
    for pipeline_id, (name, pipeline_facts, labels) in facts.items():
        if applies(rule, pipeline_id, labels):
            yield name, pipeline_id, rules.holds(rule.kind, rule.params, pipeline_facts, now)


def applies(rule: AlertRule, pipeline_id: int, labels: dict) -> bool:
    """Whether a pipeline rule is about this pipeline: the one it names, the pipelines
    carrying its label, or every pipeline."""
    if rule.pipeline_id is not None and rule.pipeline_id != pipeline_id:
        return False
    if rule.label:
        try:
            key, value = services.parse_selector(rule.label)
        except services.Invalid:
            return False  # a label no pipeline can carry (the API refuses to store one)
        return (labels or {}).get(key) == value
    return True


def _apply(rule, subject, pipeline_id, message, alert, now, summary, budget) -> None:
    current = None
    if alert is not None:
        current = rules.Open(
            state=alert.state,
            since=alert.since,
            notified_at=alert.notified_at,
            acknowledged=alert.acknowledged_at is not None,
        )
    repeat = rules.repeat_interval(
        rule.repeat_seconds, settings.CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS
    )
    action = rules.step(
        message is not None,
        current,
        hold_for=timedelta(seconds=rule.for_seconds),
        repeat=repeat,
        now=now,
    )
    if action == "pend":
        Alert.objects.create(
            rule=rule, pipeline_id=pipeline_id, subject=subject, state=AlertState.PENDING,
            message=message, since=now,
        )  # fmt: skip
    elif action == "fire":
        if alert is None:
            alert = Alert(rule=rule, pipeline_id=pipeline_id, subject=subject, since=now)
        alert.state, alert.message = AlertState.FIRING, message
        alert.fired_at = alert.notified_at = now
        alert.save()
        summary["fired"] += 1
        _send(rule, alert, "firing", message, now, summary, budget)
    elif action == "repeat":
        alert.message, alert.notified_at, alert.repeats = message, now, alert.repeats + 1
        alert.save(update_fields=["message", "notified_at", "repeats"])
        summary["repeated"] += 1
        _send(rule, alert, "repeat", message, now, summary, budget)
    elif action == "resolve":
        alert.state, alert.resolved_at = AlertState.RESOLVED, now
        alert.save(update_fields=["state", "resolved_at"])
        summary["resolved"] += 1
        why = "the rule was disabled" if not rule.enabled else "no longer holds"
        was = f"resolved ({why}): was {alert.message}"
        _send(rule, alert, "resolved", was, now, summary, budget)
    elif action == "drop":
        alert.state, alert.resolved_at = AlertState.DROPPED, now
        alert.save(update_fields=["state", "resolved_at"])
    elif alert is not None and message is not None and alert.message != message:
        alert.message = message  # still holding: its latest words
        alert.save(update_fields=["message"])


def _send(rule, alert, event: str, message: str, now: datetime, summary: dict, budget) -> None:
    if rule.silenced_until is not None and rule.silenced_until > now:
        summary["silenced"] += 1
        log.info("alert %s %s: silenced until %s", alert, event, rule.silenced_until)
        return
    deliveries = []
    for channel in rule.channels.all():
        send, suppressed_before = budget.take(channel)
        text = message
        if suppressed_before:
            text += f"\n({budget.suppressed_note(suppressed_before)})"
        deliveries.append(
            AlertDelivery(
                alert=alert, channel=channel, event=event, message=text, next_try_at=now,
                queued_at=now, suppressed_before=suppressed_before,
                outcome=DeliveryStatus.PENDING if send else DeliveryStatus.SUPPRESSED,
            )
        )  # fmt: skip
        if not send:
            summary["suppressed"] += 1
            log.info(
                "alert %s %s to %s: suppressed (over the channel's limit)", alert, event, channel
            )
    AlertDelivery.objects.bulk_create(deliveries)


class ChannelBudget:
    """How many more messages each channel takes in this round: at most
    CONTROLPLANE_ALERT_CHANNEL_LIMIT within CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES, all
    rules together, so that no rule (nor many rules at once) floods a channel.

    Counted from the deliveries stored in Postgres, never in a process's memory, under the
    channel row's lock: rounds are one at a time (ROUND_LOCK), and the lock keeps the count
    right for anything else that queues deliveries. Retries of a message do not count again;
    a suppressed message is stored (outcome `suppressed`), never sent, and the next message
    to the channel says how many were."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.limit = settings.CONTROLPLANE_ALERT_CHANNEL_LIMIT
        self.window = timedelta(minutes=settings.CONTROLPLANE_ALERT_CHANNEL_WINDOW_MINUTES)
        self._used: dict[int, int] = {}
        self._suppressed: dict[int, int] = {}

    def take(self, channel) -> tuple[bool, int]:
        """Whether a message to `channel` goes out, and how many were suppressed before it
        (it says so; then they are reported)."""
        if channel.pk not in self._used:
            self._count(channel)
        if self.limit and self._used[channel.pk] >= self.limit:
            self._suppressed[channel.pk] += 1
            return False, 0
        self._used[channel.pk] += 1
        reported, self._suppressed[channel.pk] = self._suppressed[channel.pk], 0
        return True, reported

    def suppressed_note(self, count: int) -> str:
        what = "message was" if count == 1 else "messages were"
        return (
            f"{count} earlier {what} not sent to this channel: at most {self.limit} per "
            f"{self.window.total_seconds() / 60:g} min"
        )

    def _count(self, channel) -> None:
        list(AlertChannel.objects.select_for_update(no_key=True).filter(pk=channel.pk).values("pk"))
        mine = AlertDelivery.objects.filter(channel_id=channel.pk)
        sent = mine.exclude(outcome=DeliveryStatus.SUPPRESSED)
        self._used[channel.pk] = sent.filter(queued_at__gt=self.now - self.window).count()
        last = sent.aggregate(last=Max("id"))["last"] or 0
        self._suppressed[channel.pk] = mine.filter(
            outcome=DeliveryStatus.SUPPRESSED, id__gt=last
        ).count()


def _pipeline_facts(
    now: datetime, enabled: list[AlertRule]
) -> dict[int, tuple[str, rules.Facts, dict]]:
    windows = [
        timedelta(minutes=minutes)
        for r in enabled
        if (over := rules.KINDS[r.kind].failures_over)
        and isinstance(minutes := r.params.get(over), int | float)
        and not isinstance(minutes, bool)
    ]
    window = max([DEFAULT_FAILURE_WINDOW, *windows])
    failures: dict[int, list[datetime]] = {}
    for pipeline_id, at in Failure.objects.filter(at__gte=now - window).values_list(
        "pipeline_id", "at"
    ):
        failures.setdefault(pipeline_id, []).append(at)
    latest_failure = dict(
        Failure.objects.values("pipeline_id")
        .annotate(at=Max("at"))
        .values_list("pipeline_id", "at")
    )
    figures = {
        f.pipeline_id: f
        for f in PipelineFigures.objects.only(
            "pipeline_id", "lag_records", "lag_seconds", "backpressure", "data_loss_seconds"
        )
    }
    growth = [r for r in enabled if _hours(r) is not None]
    series = {}
    if growth:
        # Only the pipelines the rules are about, when every rule names one.
        named = {r.pipeline_id for r in growth}
        series = state.series(
            now, [timedelta(hours=_hours(r)) for r in growth], None if None in named else named
        )
    latest_run = {}
    for run in (
        Run.objects.order_by("pipeline_id", "-generation")
        .distinct("pipeline_id")
        .only("pipeline_id", "started_at", "last_batch_at")
    ):
        latest_run[run.pipeline_id] = run
    # Health and the last cause, as the overview, the page and the API show them.
    assessed = assessing.assess(
        list(Pipeline.objects.only("id", "status", "desired_state", "attempt", "restarts_since")),
        now,
    )
    writer_windows = [
        timedelta(minutes=minutes)
        for r in enabled
        if (over := rules.KINDS[r.kind].writers_over)
        and isinstance(minutes := r.params.get(over), int | float)
        and not isinstance(minutes, bool)
    ]
    appeared = writer_schemas.appeared(now - max(writer_windows)) if writer_windows else {}
    out = {}
    for pipeline_id, name, status, desired, labels, rolled_at, note in Pipeline.objects.values_list(
        "id",
        "name",
        "status",
        "desired_state",
        "labels",
        "auto_rolled_back_at",
        "auto_rollback_note",
    ):
        stored = figures.get(pipeline_id)
        run = latest_run.get(pipeline_id)
        judged = assessed.get(pipeline_id)
        out[pipeline_id] = (
            name,
            rules.Facts(
                status=status,
                desired_state=desired,
                lag_records=stored.lag_records if stored else None,
                lag_seconds=stored.lag_seconds if stored else None,
                backpressure=stored.backpressure if stored else None,
                last_commit_at=run.last_batch_at if run else None,
                started_at=run.started_at if run else None,
                backing_off_since=latest_failure.get(pipeline_id),
                data_loss_seconds=stored.data_loss_seconds if stored else None,
                failures_at=failures.get(pipeline_id, []),
                rolled_back_at=rolled_at,
                rolled_back_note=note,
                state=series.get(pipeline_id, ()),
                health=judged.health.state if judged else "",
                health_why=judged.health.why if judged else "",
                health_red=bool(judged and judged.health.colour == health.RED),
                cause=judged.cause.line if judged and judged.cause else "",
                writer_appeared=appeared.get(pipeline_id, ()),
            ),
            labels or {},
        )
    return out


def _hours(rule: AlertRule) -> float | None:
    """The hours of state history a rule reads (None: it reads none, or its are not valid)."""
    over = rules.KINDS[rule.kind].state_over
    if not over:
        return None
    hours = (rule.params or {}).get(over)
    if isinstance(hours, bool) or not isinstance(hours, int | float) or hours <= 0:
        return None  # the API refuses such parameters; a rule stored otherwise is skipped
    return float(hours)


def state_growth(pipeline: Pipeline, now: datetime) -> dict:
    """For the pipeline page: its operators' growth over the window of the state-growth
    rules about it (the longest; DEFAULT_HOURS without one), and what each of those rules
    says now (only the ones that hold)."""
    about = [
        r
        for r in AlertRule.objects.filter(kind="state-growth", enabled=True).order_by("name")
        if _hours(r) is not None and applies(r, pipeline.pk, pipeline.labels)
    ]
    hours = max((_hours(r) for r in about), default=state.DEFAULT_HOURS)
    windows = [timedelta(hours=h) for h in {hours, *(_hours(r) for r in about)}]
    found = state.series(now, windows, [pipeline.pk]).get(pipeline.pk, ())
    facts = rules.Facts(status=pipeline.status, desired_state=pipeline.desired_state, state=found)
    holding = []
    for rule in about:
        message = rules.holds(rule.kind, rule.params, facts, now)
        if message:
            holding.append({"rule": rule.name, "message": message})
    window = timedelta(hours=hours)
    return {
        "hours": hours,
        "trends": {s.operator: assess(s.samples, now, window) for s in found},
        "holding": holding,
    }


def _control_plane_facts() -> rules.ControlPlaneFacts:
    tick = ReconcilerState.objects.filter(id=1).values_list("last_tick_at", flat=True).first()
    collected = PipelineFigures.objects.aggregate(at=Max("collected_at"))["at"]
    drifted = tuple(
        (f"{kind}/{name}", fleet, since)
        for kind, name, fleet, since in ManagedObject.objects.filter(drifted_at__isnull=False)
        .order_by("drifted_at", "kind", "name")
        .values_list("kind", "name", "fleet", "drifted_at")
    )
    return rules.ControlPlaneFacts(last_tick_at=tick, last_collected_at=collected, drifted=drifted)


class AlertFigures:
    """A prometheus_client collector: the open alerts (`cp_alert_firing`, 1 per firing alert,
    labelled by rule and subject) and deliveries that failed for good."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        firing = GaugeMetricFamily(
            "cp_alert_firing", "1 for each firing alert", labels=["acknowledged", "rule", "subject"]
        )
        for rule, subject, acked in Alert.objects.filter(state=AlertState.FIRING).values_list(
            "rule__name", "subject", "acknowledged_at"
        ):
            firing.add_metric(["true" if acked else "false", rule, subject], 1.0)
        failed = CounterMetricFamily(
            "cp_alert_deliveries_failed", "alert deliveries given up after every attempt"
        )
        failed.add_metric(
            [], float(AlertDelivery.objects.filter(outcome=DeliveryStatus.FAILED).count())
        )
        suppressed = CounterMetricFamily(
            "cp_alert_deliveries_suppressed",
            "alert messages not sent: over their channel's rate limit",
        )
        suppressed.add_metric(
            [], float(AlertDelivery.objects.filter(outcome=DeliveryStatus.SUPPRESSED).count())
        )
        yield firing
        yield failed
        yield suppressed
