"""Alert rules' conditions and an alert's life (controlplane.alerting.rules): pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from controlplane.alerting import rules
from controlplane.alerting.rules import ControlPlaneFacts, Facts, Open, holds, step
from controlplane.alerting.state_growth import OperatorSeries, Sample

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def ago(**kw) -> datetime:
    return NOW - timedelta(**kw)


def facts(**kw) -> Facts:
    return Facts(**{"status": "running", "desired_state": "running", **kw})


def operator(index: int, name: str, rows_at, hours: float = 7) -> OperatorSeries:
    """Samples every 5 minutes over the last `hours`, rows_at(hours ago), 100 bytes a row."""
    samples = []
    for i in range(int(hours * 12) + 1):
        rows = round(rows_at(hours - i / 12))
        samples.append(Sample(ago(hours=hours) + timedelta(minutes=5 * i), rows, rows * 100))
    return OperatorSeries(index, name, tuple(samples))


GROWING = operator(0, "stateStoreSave", lambda hours_ago: 50_000 - 4_000 * hours_ago)
BOUNDED = operator(1, "dedupe", lambda hours_ago: 500 + 400 * ((hours_ago % 0.5) / 0.5))


@pytest.mark.parametrize(
    ("kind", "params", "given", "expected"),
    [
        (
            "gave-up",
            {},
            facts(status="failed"),
            "the restart policy gave up: the pipeline is failed",
        ),
        ("gave-up", {}, facts(status="backing-off"), None),
        (
            "backing-off",
            {"minutes": 10},
            facts(status="backing-off", backing_off_since=ago(minutes=11)),
            "backing off for 11 min (more than 10 min)",
        ),
        (
            "backing-off",
            {"minutes": 10},
            facts(status="backing-off", backing_off_since=ago(minutes=9)),
            None,
        ),
        (
            "restarts",
            {"count": 2, "minutes": 5},
            facts(failures_at=[ago(minutes=1), ago(minutes=2), ago(minutes=4), ago(minutes=30)]),
            "3 failures within 5 min (more than 2)",
        ),
        ("restarts", {"count": 3, "minutes": 5}, facts(failures_at=[ago(minutes=1)] * 3), None),
        ("lag-seconds", {"above": 60}, facts(lag_seconds=61.2), "lag 61 s (above 60 s)"),
        ("lag-seconds", {"above": 60}, facts(lag_seconds=None), None),
        (
            "lag-records",
            {"above": 1000},
            facts(lag_records=1001),
            "lag 1,001 records (above 1,000)",
        ),
        (
            "backpressure-high",
            {},
            facts(backpressure="high"),
            "backpressure high: batches take longer than the trigger",
        ),
        ("backpressure-high", {}, facts(backpressure="low"), None),
        (
            "no-commit",
            {"minutes": 5},
            facts(last_commit_at=ago(minutes=6), started_at=ago(hours=1)),
            "no batch committed for 6 min (more than 5 min)",
        ),
        (
            "no-commit",
            {"minutes": 5},
            facts(started_at=ago(minutes=7)),
            "no batch committed since the start for 7 min (more than 5 min)",
        ),
        (
            "no-commit",
            {"minutes": 5},
            facts(desired_state="stopped", last_commit_at=ago(hours=2)),
            None,
        ),
        ("no-commit", {"minutes": 5}, facts(last_commit_at=ago(minutes=1)), None),
        (
            "data-loss",
            {"below": 900},
            facts(data_loss_seconds=600),
            "unread records may be deleted by retention in 10 min (below 900 s)",
        ),
        (
            "data-loss",
            {"below": 900},
            facts(data_loss_seconds=0),
            "unread records are past the topic's retention: they may be deleted now",
        ),
        ("data-loss", {"below": 900}, facts(data_loss_seconds=1200), None),
        ("data-loss", {"below": 900}, facts(), None),
        (
            "state-growth",
            {"hours": 6},
            facts(state=(GROWING, BOUNDED)),
            "state grows without bound over the last 6 h: operator 0 (stateStoreSave): "
            "+4,000 rows/h, +390.6 KB/h (50,000 rows now)",
        ),
        ("state-growth", {"hours": 6}, facts(state=(BOUNDED,)), None),
        ("state-growth", {"hours": 6}, facts(), None),  # no state at all
        ("state-growth", {"hours": 12}, facts(state=(GROWING,)), None),  # only 7 h known
    ],
)
def test_each_kind_says_why_it_holds(kind, params, given, expected):
    assert rules.params_problem(kind, params) is None
    assert holds(kind, params, given, NOW) == expected


def test_the_control_plane_rule_watches_the_tick_and_the_collector():
    assert (
        rules.control_plane_holds(
            "control-plane",
            {"minutes": 2},
            ControlPlaneFacts(ago(seconds=30), ago(seconds=20)),
            NOW,
        )
        is None
    )
    assert rules.control_plane_holds(
        "control-plane", {"minutes": 2}, ControlPlaneFacts(ago(minutes=5), None), NOW
    ) == ("the reconcile tick has not run for 5 min")
    assert rules.control_plane_holds(
        "control-plane", {"minutes": 2}, ControlPlaneFacts(None, ago(minutes=3)), NOW
    ) == ("the reconcile tick has not run yet; the metrics collector has not run for 3 min")


def test_the_fleet_drift_rule_names_what_drifted_longer_than_its_minutes():
    fresh = ControlPlaneFacts(NOW, NOW, drifted=(("Pipeline/a", "shop", ago(minutes=1)),))
    assert rules.control_plane_holds("fleet-drift", {"minutes": 5}, fresh, NOW) is None
    old = ControlPlaneFacts(
        NOW,
        NOW,
        drifted=tuple((f"Pipeline/p{i}", "shop", ago(minutes=30 - i)) for i in range(7)),
    )
    assert rules.control_plane_holds("fleet-drift", {"minutes": 5}, old, NOW) == (
        "7 objects differ from their fleet's files: Pipeline/p0 (fleet shop, for 30 min),"
        " Pipeline/p1 (fleet shop, for 29 min), Pipeline/p2 (fleet shop, for 28 min),"
        " Pipeline/p3 (fleet shop, for 27 min), Pipeline/p4 (fleet shop, for 26 min) and 2 more"
    )


@pytest.mark.parametrize(
    ("kind", "params", "problem"),
    [
        ("nope", {}, "must be one of"),
        ("lag-seconds", {}, "lag-seconds needs above (a number)"),
        ("lag-seconds", {"above": "9"}, "lag-seconds needs above (a number)"),
        ("lag-seconds", {"above": True}, "lag-seconds needs above (a number)"),
        ("lag-seconds", {"above": -1}, "above must not be negative"),
        ("gave-up", {"minutes": 3}, "gave-up takes no parameters; not minutes"),
        ("state-growth", {"hours": 0}, "hours must be more than 0"),
        ("state-growth", {}, "state-growth needs hours (a number)"),
    ],
)
def test_bad_parameters_are_named(kind, params, problem):
    assert problem in rules.params_problem(kind, params)


def test_an_alert_pends_fires_repeats_until_acknowledged_and_resolves():
    hold, repeat = timedelta(minutes=5), timedelta(minutes=30)

    def at(state, since, notified=None, ack=False, holding=True, now=NOW):
        alert = Open(state, since, notified, ack) if state else None
        return step(holding, alert, hold_for=hold, repeat=repeat, now=now)

    assert at(None, None) == "pend"
    assert step(True, None, hold_for=timedelta(0), repeat=repeat, now=NOW) == "fire"
    assert at("pending", ago(minutes=4)) == ""
    assert at("pending", ago(minutes=5)) == "fire"
    assert at("pending", ago(minutes=4), holding=False) == "drop"  # never sent
    assert at("firing", ago(hours=1), ago(minutes=29)) == ""
    assert at("firing", ago(hours=1), ago(minutes=30)) == "repeat"
    assert at("firing", ago(hours=1), ago(minutes=30), ack=True) == ""  # acknowledged
    assert (
        step(True, Open("firing", ago(hours=9), ago(hours=8)), hold_for=hold, repeat=None, now=NOW)
        == ""
    )
    assert at("firing", ago(hours=1), ago(minutes=1), holding=False) == "resolve"
    assert at(None, None, holding=False) == ""
