"""Alert rules: when a rule's condition holds for a pipeline (or for the control plane), and
what an alert does next. Pure: no Django, no Celery; time is passed in.

An alert is pending while its condition has held for less than the rule's `for` time, fires
once it has held that long, repeats every `repeat` while it still holds (not once it is
acknowledged), and resolves when the condition no longer holds. A pending alert whose
condition goes away is dropped unsent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .state_growth import OperatorSeries, assess


@dataclass(frozen=True)
class RuleKind:
    """What a kind of rule takes (its parameters, numbers), what it watches (in words), and
    what evaluating it needs."""

    params: tuple[str, ...]
    watches: str
    positive: tuple[str, ...] = ()  # parameters that must be more than 0 (others: >= 0)
    about_pipelines: bool = True  # False: about the control plane itself
    failures_over: str = ""  # the parameter: minutes of failure history it reads
    state_over: str = ""  # the parameter: hours of state history it reads
    writers_over: str = ""  # the parameter: minutes of new writer schemas it reads


KINDS: dict[str, RuleKind] = {
    "gave-up": RuleKind((), "the pipeline's restart policy gave up (status failed)"),
    "unhealthy": RuleKind(
        (), "the pipeline's health is red: failed, crash-looping or failing (docs/oncall.md)"
    ),
    "backing-off": RuleKind(
        ("minutes",), "the pipeline has been backing off for longer than N minutes"
    ),
    "restarts": RuleKind(
        ("count", "minutes"), "more than COUNT failures within MINUTES", failures_over="minutes"
    ),
    "lag-seconds": RuleKind(
        ("above",), "lag in seconds above a threshold (for the rule's `for` time)"
    ),
    "lag-records": RuleKind(
        ("above",), "lag in records above a threshold (for the rule's `for` time)"
    ),
    "backpressure-high": RuleKind((), "backpressure high (for the rule's `for` time)"),
    "no-commit": RuleKind(("minutes",), "wanted running, and no batch committed for N minutes"),
    "data-loss": RuleKind(
        ("below",), "Kafka's retention may delete unread records within BELOW seconds"
    ),
    "rolled-back": RuleKind(
        ("minutes",), "a bad deploy was rolled back automatically within the last N minutes"
    ),
    "state-growth": RuleKind(
        ("hours",),
        "a stateful operator's state kept growing over the last N hours, without levelling off",
        positive=("hours",),
        state_over="hours",
    ),
    "writer-schema": RuleKind(
        ("minutes",),
        "a new writer schema appeared in a schema-registry source's topics within the last"
        " N minutes",
        positive=("minutes",),
        writers_over="minutes",
    ),
    "fleet-drift": RuleKind(
        ("minutes",),
        "an object kept in a fleet's files was changed outside them (drifted) more than N"
        " minutes ago and is still so",
        about_pipelines=False,
    ),
    "control-plane": RuleKind(
        ("minutes",),
        "the control plane's reconcile tick or metrics collector has not run for N minutes",
        about_pipelines=False,
    ),
}
CONTROL_PLANE = "control plane"  # the subject of control-plane rules


@dataclass(frozen=True)
class Facts:
    """What is known of one pipeline when the rules are evaluated."""

    status: str
    desired_state: str
    lag_records: int | None = None
    lag_seconds: float | None = None
    backpressure: str | None = None
    last_commit_at: datetime | None = None
    started_at: datetime | None = None  # the current run's start, if any
    backing_off_since: datetime | None = None
    data_loss_seconds: float | None = None
    failures_at: list[datetime] = field(default_factory=list)  # recent failures' times
    rolled_back_at: datetime | None = None  # its last automatic rollback
    rolled_back_note: str = ""
    # Its stateful operators' rows and sizes over the longest state-growth window.
    state: tuple[OperatorSeries, ...] = ()
    # Its health (controlplane.observability.health): the state, why, and whether red.
    health: str = ""
    health_why: str = ""
    health_red: bool = False
    cause: str = ""  # its last failure's cause, in one line (since its last start by hand)
    # New writer schemas in its topics, newest first: (when it appeared, what it is, in words).
    writer_appeared: tuple[tuple[datetime, str], ...] = ()


@dataclass(frozen=True)
class ControlPlaneFacts:
    last_tick_at: datetime | None
    last_collected_at: datetime | None
    # Objects drifted from their fleet's files: (Kind/name, fleet, since), oldest first.
    drifted: tuple[tuple[str, str, datetime], ...] = ()


def params_problem(kind: str, params: dict) -> str | None:
    """Why these parameters do not fit the kind, or None."""
    if kind not in KINDS:
        return f"must be one of {', '.join(sorted(KINDS))}"
    wanted = KINDS[kind].params
    unknown = sorted(set(params) - set(wanted))
    if unknown:
        return f"{kind} takes {', '.join(wanted) or 'no parameters'}; not {', '.join(unknown)}"
    for name in wanted:
        value = params.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{kind} needs {name} (a number)"
        if value < 0:
            return f"{name} must not be negative"
    for name in KINDS[kind].positive:
        if params[name] <= 0:
            return f"{name} must be more than 0"
    return None


def repeat_problem(seconds: int, floor: int) -> str | None:
    """Why a rule's repeat interval is refused, or None: reminders more often than `floor`
    (the setting CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS) would flood its channels."""
    if 0 < seconds < floor:
        return f"must be 0 (never repeat) or at least {floor} s"
    return None


def repeat_interval(seconds: int, floor: int) -> timedelta | None:
    """The interval a rule repeats at (None: never): never shorter than `floor`, even for a
    rule stored before the floor was raised."""
    return timedelta(seconds=max(seconds, floor)) if seconds else None


def _gave_up(params: dict, facts: Facts, now: datetime) -> str | None:
    if facts.status != "failed":
        return None
    return "the restart policy gave up: the pipeline is failed" + _because(facts)


def _unhealthy(params: dict, facts: Facts, now: datetime) -> str | None:
    return f"{facts.health}: {facts.health_why}" if facts.health_red else None


def _backing_off(params: dict, facts: Facts, now: datetime) -> str | None:
    limit = timedelta(minutes=params["minutes"])
    since = facts.backing_off_since
    if facts.status == "backing-off" and since is not None and now - since > limit:
        return (
            f"backing off for {_minutes(now - since)} (more than {params['minutes']:g} min)"
            + _because(facts)
        )
    return None


def _restarts(params: dict, facts: Facts, now: datetime) -> str | None:
    window = timedelta(minutes=params["minutes"])
    recent = [at for at in facts.failures_at if now - at <= window]
    if len(recent) > params["count"]:
        return (
            f"{len(recent)} failures within {params['minutes']:g} min "
            f"(more than {params['count']:g})" + _because(facts)
        )
    return None


def _lag_seconds(params: dict, facts: Facts, now: datetime) -> str | None:
    if facts.lag_seconds is not None and facts.lag_seconds > params["above"]:
        return f"lag {facts.lag_seconds:.0f} s (above {params['above']:g} s)"
    return None


def _lag_records(params: dict, facts: Facts, now: datetime) -> str | None:
    if facts.lag_records is not None and facts.lag_records > params["above"]:
        return f"lag {facts.lag_records:,} records (above {params['above']:,.0f})"
    return None


def _backpressure_high(params: dict, facts: Facts, now: datetime) -> str | None:
    return (
        "backpressure high: batches take longer than the trigger"
        if facts.backpressure == "high"
        else None
    )


def _no_commit(params: dict, facts: Facts, now: datetime) -> str | None:
    if facts.desired_state != "running":
        return None
    limit = timedelta(minutes=params["minutes"])
    since = max(filter(None, (facts.last_commit_at, facts.started_at)), default=None)
    if since is not None and now - since > limit:
        what = (
            "no batch committed" if facts.last_commit_at else "no batch committed since the start"
        )
        return f"{what} for {_minutes(now - since)} (more than {params['minutes']:g} min)"
    return None


def _data_loss(params: dict, facts: Facts, now: datetime) -> str | None:
    left = facts.data_loss_seconds
    if left is not None and left < params["below"]:
        if left <= 0:
            return "unread records are past the topic's retention: they may be deleted now"
        return (
            f"unread records may be deleted by retention in {_minutes(timedelta(seconds=left))}"
            f" (below {params['below']:g} s)"
        )
    return None


def _rolled_back(params: dict, facts: Facts, now: datetime) -> str | None:
    at = facts.rolled_back_at
    if at is not None and now - at <= timedelta(minutes=params["minutes"]):
        return facts.rolled_back_note or "rolled back automatically"
    return None


def _state_growth(params: dict, facts: Facts, now: datetime) -> str | None:
    window = timedelta(hours=params["hours"])
    growing = []
    for series in facts.state:
        trend = assess(series.samples, now, window)
        if trend.unbounded:
            growing.append(f"{series.label}: {trend.rates()} ({trend.rows_now:,} rows now)")
    if not growing:
        return None
    which = "; ".join(growing)
    return f"state grows without bound over the last {params['hours']:g} h: {which}"


def _writer_schema(params: dict, facts: Facts, now: datetime) -> str | None:
    window = timedelta(minutes=params["minutes"])
    recent = [what for at, what in facts.writer_appeared if now - at <= window]
    if not recent:
        return None
    return "a new writer schema appeared in its topics: " + "; ".join(recent)


# What each pipeline rule kind checks: kind -> (params, facts, now) -> its message, or None.
_HOLDS = {
    "gave-up": _gave_up,
    "unhealthy": _unhealthy,
    "backing-off": _backing_off,
    "restarts": _restarts,
    "lag-seconds": _lag_seconds,
    "lag-records": _lag_records,
    "backpressure-high": _backpressure_high,
    "no-commit": _no_commit,
    "data-loss": _data_loss,
    "rolled-back": _rolled_back,
    "state-growth": _state_growth,
    "writer-schema": _writer_schema,
}


def holds(kind: str, params: dict, facts: Facts, now: datetime) -> str | None:
    """The message saying why the rule holds for the pipeline, or None."""
    check = _HOLDS.get(kind)
    if check is None:
        raise ValueError(f"not a pipeline rule: {kind}")
    return check(params, facts, now)


def control_plane_holds(
    kind: str, params: dict, facts: ControlPlaneFacts, now: datetime
) -> str | None:
    """Why a control-plane rule of `kind` holds, or None."""
    return _PLANE_CONDITIONS[kind](params, facts, now)


def _stale(params: dict, facts: ControlPlaneFacts, now: datetime) -> str | None:
    """Why the control plane itself is unhealthy, or None. The collector counts once it has
    stored anything (with no pipeline it has nothing to store)."""
    limit = timedelta(minutes=params["minutes"])
    stale = []
    if facts.last_tick_at is None or now - facts.last_tick_at > limit:
        ran = f"for {_minutes(now - facts.last_tick_at)}" if facts.last_tick_at else "yet"
        stale.append(f"the reconcile tick has not run {ran}")
    if facts.last_collected_at is not None and now - facts.last_collected_at > limit:
        stale.append(
            f"the metrics collector has not run for {_minutes(now - facts.last_collected_at)}"
        )
    return "; ".join(stale) or None


def _drifted(params: dict, facts: ControlPlaneFacts, now: datetime) -> str | None:
    """Which objects have been drifted from their fleet's files for longer than N minutes
    (at most 5 named, the oldest first), or None."""
    limit = timedelta(minutes=params["minutes"])
    old = [(key, fleet, since) for key, fleet, since in facts.drifted if now - since > limit]
    if not old:
        return None
    named = ", ".join(
        f"{key} (fleet {fleet}, for {_minutes(now - since)})" for key, fleet, since in old[:5]
    )
    more = f" and {len(old) - 5} more" if len(old) > 5 else ""
    noun = "object differs from its" if len(old) == 1 else "objects differ from their"
    return f"{len(old)} {noun} fleet's files: {named}{more}"


_PLANE_CONDITIONS = {"control-plane": _stale, "fleet-drift": _drifted}


@dataclass(frozen=True)
class Open:
    """An alert not yet resolved: pending (not sent) or firing (sent)."""

    state: str  # "pending" or "firing"
    since: datetime  # the condition has held since
    notified_at: datetime | None  # firing: when it was last sent
    acknowledged: bool = False


def step(
    holding: bool,
    alert: Open | None,
    *,
    hold_for: timedelta,
    repeat: timedelta | None,
    now: datetime,
) -> str:
    """What to do now: "" (nothing), "pend", "fire", "repeat", "resolve" or "drop"."""
    if holding:
        if alert is None:
            return "fire" if hold_for <= timedelta(0) else "pend"
        if alert.state == "pending":
            return "fire" if now - alert.since >= hold_for else ""
        if (
            repeat
            and not alert.acknowledged
            and alert.notified_at
            and now - alert.notified_at >= repeat
        ):
            return "repeat"
        return ""
    if alert is None:
        return ""
    return "drop" if alert.state == "pending" else "resolve"


def _minutes(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


def _because(facts: Facts) -> str:
    """Its last failure's cause, after a message about failures."""
    return f"; last failure: {facts.cause}" if facts.cause else ""
