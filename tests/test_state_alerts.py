"""The state-growth alert rule, evaluated by the engine over stored state samples (the
bounded probes of controlplane.alerting.state, hourly roll-ups beyond the raw retention),
and its status on the pipeline page."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertChannel, AlertDelivery, AlertRule
from controlplane.alerting.state import PROBES, series
from controlplane.definitions.models import Pipeline, Run, StateSample
from controlplane.observability import state
from controlplane.observability.retention import compact_progress
from tests.clients import HDFS, ROCKSDB, client_with, stateful

NOW = timezone.now().replace(microsecond=0)


def new_run(name: str) -> Run:
    """A running pipeline `name` (the `orders` pipeline's spec) with its current run."""
    orders = Pipeline.objects.get(name="orders")
    pipeline = orders if name == "orders" else Pipeline.objects.create(name=name, spec=orders.spec)
    Pipeline.objects.filter(pk=pipeline.pk).update(
        desired_state="running", status="running", generation=1
    )
    return Run.objects.create(pipeline=pipeline, generation=1, spec_version=1, state="running")


def feed(run: Run, rows_at, *, hours: float, until=NOW, every=timedelta(minutes=5)) -> None:
    """Batches every `every` for `hours` up to `until`: operator 0 (RocksDB) holding
    rows_at(hours since the first) rows, operator 1 (HDFS-backed) a steady 80."""
    count = int(timedelta(hours=hours) / every)
    batches = []
    first = run.last_batch_id + 1 if run.last_batch_id is not None else 0
    for i in range(count + 1):
        at = until - timedelta(hours=hours) + i * every
        rows = round(rows_at((at - (until - timedelta(hours=hours))).total_seconds() / 3600))
        operator = {**ROCKSDB, "numRowsTotal": rows, "customMetrics": {
            **ROCKSDB["customMetrics"], "rocksdbSstFileSize": rows * 200,
        }}  # fmt: skip
        batches.append((run, stateful(first + i, operator, HDFS), at))
    state.store(batches)
    Run.objects.filter(pk=run.pk).update(last_batch_id=first + count, last_batch_at=until)
    run.refresh_from_db()


@pytest.fixture
def mail(db):
    return AlertChannel.objects.create(name="mail", kind="email", target="oncall@example.com")


def rule(mail, hours=6, **kw) -> AlertRule:
    made = AlertRule.objects.create(
        name=f"state-{hours}h", kind="state-growth", params={"hours": hours}, **kw
    )
    made.channels.set([mail])
    return made


def test_state_that_keeps_rising_fires_bounded_state_does_not_and_levelling_off_resolves(
    pipeline, mail
):
    growing, bounded = new_run("orders"), new_run("windows")
    feed(growing, lambda h: 10_000 + 6_000 * h, hours=6.5)
    feed(bounded, lambda h: 5_000 + 40_000 * ((h % 0.5) / 0.5), hours=6.5)  # windows evicted
    rule(mail)

    summary = engine.evaluate(NOW)
    assert summary["fired"] == 1
    alert = Alert.objects.get()
    assert (alert.subject, alert.state) == ("orders", "firing")
    assert alert.message.startswith(
        "state grows without bound over the last 6 h: operator 0 (stateStoreSave): +6,000 rows/h,"
        " +1.1 MB/h ("
    )
    assert "operator 1" not in alert.message  # the deduplication's state stays at 80 rows
    assert AlertDelivery.objects.get().event == "firing"

    # Six hours later its windows are evicted as fast as they open: it levels off.
    feed(
        growing, lambda h: 49_000 + 2_000 * math.sin(h * 6), hours=6, until=NOW + timedelta(hours=6)
    )
    feed(
        bounded,
        lambda h: 5_000 + 40_000 * ((h % 0.5) / 0.5),
        hours=6,
        until=NOW + timedelta(hours=6),
    )
    assert engine.evaluate(NOW + timedelta(hours=6))["resolved"] == 1
    assert Alert.objects.get().state == "resolved"


def test_a_pipeline_just_started_or_stopped_is_not_judged(pipeline, mail):
    young, stopped = new_run("orders"), new_run("stopped")
    feed(young, lambda h: 6_000 * h, hours=2)  # two hours of a six-hour window
    feed(stopped, lambda h: 6_000 * h, hours=5, until=NOW - timedelta(hours=2))
    rule(mail)
    assert engine.evaluate(NOW)["fired"] == 0


def test_rules_for_one_pipeline_or_a_label_judge_only_theirs(pipeline, mail):
    growing, other = new_run("orders"), new_run("other")
    feed(growing, lambda h: 6_000 * h, hours=6.5)
    feed(other, lambda h: 6_000 * h, hours=6.5)
    Pipeline.objects.filter(name="other").update(labels={"team": "payments"})
    rule(mail, hours=6, pipeline=Pipeline.objects.get(name="orders"))
    rule(mail, hours=5, label="team:payments")
    engine.evaluate(NOW)
    assert sorted(Alert.objects.values_list("rule__name", "subject")) == [
        ("state-5h", "other"),
        ("state-6h", "orders"),
    ]


def test_probes_read_a_bounded_number_of_samples_each_window_as_densely(pipeline):
    run = new_run("orders")
    feed(run, lambda h: 6_000 * h, hours=3, every=timedelta(seconds=30))  # 361 batches
    found = series(NOW, [timedelta(hours=3)])[run.pipeline_id]
    assert [s.operator for s in found] == [0, 1]
    assert len(found[0].samples) == PROBES  # not 361
    both = series(NOW, [timedelta(hours=3), timedelta(minutes=30)])[run.pipeline_id]
    last = NOW - timedelta(minutes=30)
    alone = [s for s in found[0].samples if s.at > last]
    recent = [s for s in both[0].samples if s.at > last]
    # The short window's own probes (every 15 s) find each of its 60 batches; the long
    # window's alone (every 90 s) a third of them.
    assert (len(alone), len(recent)) == (20, 60)


def test_hours_already_rolled_up_count_too(pipeline, mail, settings):
    """A 48 h window reaches past the raw retention (24 h): the hourly roll-ups' means."""
    settings.CONTROLPLANE_PROGRESS_RAW_HOURS = 24
    run = new_run("orders")
    feed(run, lambda h: 1_000 * h, hours=50, every=timedelta(minutes=10))
    assert compact_progress(NOW)["state_rolled_up"] > 0
    assert not StateSample.objects.filter(at__lt=NOW - timedelta(hours=24)).exists()
    found = series(NOW, [timedelta(hours=48)])[run.pipeline_id][0].samples
    hourly = [s for s in found if s.at < NOW - timedelta(hours=24)]
    assert 23 <= len(hourly) <= 25 and all(s.at.minute == 30 for s in hourly)
    rule(mail, hours=48)
    assert engine.evaluate(NOW)["fired"] == 1


def test_the_pipeline_page_shows_state_its_growth_and_the_rule_that_holds(
    django_user_model, pipeline, mail
):
    client = client_with(django_user_model, "viewer")
    page = client.get(reverse("pipeline", kwargs={"name": "orders"})).content.decode()
    assert 'id="state"' not in page  # no state: no state section
    run = new_run("orders")
    feed(run, lambda h: 10_000 + 6_000 * h, hours=6.5)
    page = client.get(reverse("pipeline", kwargs={"name": "orders"})).content.decode()
    assert 'id="state"' in page
    assert 'data-state="/api/pipelines/orders/metrics/state/"' in page
    assert "<code>stateStoreSave</code>" in page and "<code>dedupeWithinWatermark</code>" in page
    assert "on disk" in page and "in memory" in page
    assert "+6,000 rows/h" in page and "grows without bound" in page
    assert "data-state-growth" not in page  # no rule says so: a trend, not a status
    rule(mail)
    page = client.get(reverse("pipeline", kwargs={"name": "orders"})).content.decode()
    assert "data-state-growth" in page
    assert "state grows without bound over the last 6 h: operator 0 (stateStoreSave)" in page
    assert "(rule state-6h)" in page
    # The charts read the state series with the page's session.
    assert client.get("/api/pipelines/orders/metrics/state/").status_code == 200
