"""Automatic rollback of a bad deploy: the verdict (pure), and the beat task over real rows
(runs, failures, figures; no Spark): a new version that fails repeatedly, or commits nothing
for N minutes while records wait, goes back to the newest version that ran healthy, audited
as the system's with the reason; the `rolled-back` alert rule says so. The rollback itself
running the older spec with real Spark: test_restore_points_spark.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertRule
from controlplane.definitions.models import (
    AuditEntry,
    Failure,
    Pipeline,
    PipelineFigures,
    Run,
    RunState,
)
from controlplane.supervision import auto_rollback
from controlplane.supervision.deploys import VersionFacts, verdict

NOW = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)


def facts(**given) -> VersionFacts:
    values = {
        "version": 4,
        "started": True,
        "committed": False,
        "failures": 0,
        "gave_up": False,
        "running_since": NOW - timedelta(minutes=5),
        "waiting_seconds": 0.0,
    }
    return VersionFacts(**{**values, **given})


def test_the_verdict():
    assert verdict(facts(), 10, NOW) is None  # young, nothing wrong yet
    assert verdict(facts(failures=2), 10, NOW) is None
    assert verdict(facts(failures=3), 10, NOW) == (
        "version 4 failed 3 times without committing a batch"
    )
    assert verdict(facts(gave_up=True, running_since=None), 10, NOW) == (
        "version 4 failed until its restart policy gave up, without committing a batch"
    )
    stalled = facts(running_since=NOW - timedelta(minutes=10), waiting_seconds=720.0)
    assert verdict(stalled, 10, NOW) == (
        "version 4 committed no batch in 10 min of running while records waited"
        " (the oldest for 12 min)"
    )
    # Records that arrived a minute ago after a quiet spell: not (yet) a bad deploy.
    fresh = facts(running_since=NOW - timedelta(minutes=30), waiting_seconds=60.0)
    assert verdict(fresh, 10, NOW) is None
    assert verdict(facts(running_since=NOW - timedelta(minutes=10)), 10, NOW) is None  # quiet
    unknown = facts(running_since=NOW - timedelta(hours=1), waiting_seconds=None)
    assert verdict(unknown, 10, NOW) is None  # the lag is not known
    stopped = facts(running_since=None, waiting_seconds=9999.0)
    assert verdict(stopped, 10, NOW) is None  # not running: not its fault
    assert verdict(facts(failures=9, committed=True), 10, NOW) is None  # it ran healthy
    assert verdict(facts(started=False, failures=5), 10, NOW) is None  # not started


def run(pipeline, generation, version, *, batch=None, started=None, state=RunState.EXITED):
    return Run.objects.create(
        pipeline=pipeline,
        generation=generation,
        spec_version=version,
        state=state,
        started_at=started or timezone.now(),
        last_batch_id=batch,
    )


@pytest.fixture
def deployed(api, pipeline):
    """orders: v1 ran healthy, v2 (a new transform) is running now, never committed."""
    from tests.factories import valid_spec

    bad = valid_spec(transform={"sql": "SELECT id, amount / 0 AS amount, ts FROM source"})
    assert (
        api.put(
            "/api/pipelines/orders/", {"name": "orders", "spec": bad}, format="json"
        ).status_code
        == 200
    )
    response = api.patch("/api/pipelines/orders/", {"auto_rollback_minutes": 10}, format="json")
    assert response.json()["auto_rollback_minutes"] == 10
    orders = Pipeline.objects.get(name="orders")
    assert orders.version == 2
    run(orders, 1, 1, batch=41)
    return orders


@pytest.mark.django_db
def test_a_version_failing_repeatedly_goes_back_to_the_last_healthy_one(api, deployed):
    for generation in (2, 3, 4):
        failed = run(deployed, generation, 2)
        Failure.objects.create(pipeline=deployed, run=failed, at=timezone.now(), cause="exit")
    AlertRule.objects.create(name="rollbacks", kind="rolled-back", params={"minutes": 30})

    assert auto_rollback.check(timezone.now()) == {"rolled_back": ["orders"], "refused": []}
    orders = Pipeline.objects.get(name="orders")
    assert orders.version == 3
    assert orders.spec == orders.versions.get(version=1).spec
    assert orders.auto_rollback_note == (
        "rolled back from version 2 to version 1's spec (now version 3):"
        " version 2 failed 3 times without committing a batch"
    )
    entry = AuditEntry.objects.get(action="rollback")
    assert entry.actor_name == "system"
    assert entry.reason == (
        "to version 1: automatic: version 2 failed 3 times without committing a batch"
    )
    # Version 3 has not run yet: nothing more to do (and never a loop).
    assert auto_rollback.check(timezone.now()) == {"rolled_back": [], "refused": []}

    engine.evaluate(timezone.now())
    alert = Alert.objects.get(rule__name="rollbacks")
    assert (alert.subject, alert.state) == ("orders", "firing")
    assert alert.message == orders.auto_rollback_note
    page = api.get("/api/pipelines/orders/").json()
    assert page["auto_rollback_note"] == orders.auto_rollback_note


@pytest.mark.django_db
def test_a_version_that_commits_nothing_while_records_wait_goes_back(deployed):
    started = timezone.now() - timedelta(minutes=11)
    run(deployed, 2, 2, started=started, state=RunState.RUNNING)
    figures = PipelineFigures.objects.create(
        pipeline=deployed, collected_at=timezone.now(), lag_records=0, lag_seconds=0.0
    )
    assert auto_rollback.check(timezone.now())["rolled_back"] == []  # a quiet topic
    figures.lag_records, figures.lag_seconds = 500, 30.0
    figures.save()
    assert auto_rollback.check(timezone.now())["rolled_back"] == []  # they just came
    figures.lag_seconds = 660.0
    figures.save()
    assert auto_rollback.check(timezone.now() - timedelta(minutes=2))["rolled_back"] == []
    assert auto_rollback.check(timezone.now())["rolled_back"] == ["orders"]
    assert "committed no batch in 10 min of running while records waited (the oldest" in (
        Pipeline.objects.get(name="orders").auto_rollback_note
    )


@pytest.mark.django_db
def test_no_rollback_without_the_setting_a_healthy_run_or_an_earlier_healthy_version(api, deployed):
    for generation in (2, 3, 4):
        failed = run(deployed, generation, 2, batch=7 if generation == 4 else None)
        Failure.objects.create(pipeline=deployed, run=failed, at=timezone.now(), cause="exit")
    assert auto_rollback.check(timezone.now())["rolled_back"] == []  # v2 committed once
    Run.objects.filter(pipeline=deployed, generation=4).update(last_batch_id=None)
    Run.objects.filter(pipeline=deployed, generation=1).update(last_batch_id=None)
    assert auto_rollback.check(timezone.now())["rolled_back"] == []  # v1 never ran healthy
    Run.objects.filter(pipeline=deployed, generation=1).update(last_batch_id=41)
    api.patch("/api/pipelines/orders/", {"auto_rollback_minutes": None}, format="json")
    assert auto_rollback.check(timezone.now())["rolled_back"] == []  # not asked for
