"""The metrics collector's round, without Kafka: what it stores, and that it survives a
pipeline deleted under it and never runs twice at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

from controlplane.definitions.models import LagSample, Pipeline, PipelineFigures
from controlplane.observability import collector, metrics
from tests.factories import valid_spec

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def make(name: str) -> Pipeline:
    return Pipeline.objects.create(name=name, spec=valid_spec())  # no such connection here


def test_a_round_stores_figures_and_a_sample_per_pipeline(db):
    a, b = make("a"), make("b")
    summary = collector.collect(NOW)
    assert (summary["pipelines"], summary["lag_unknown"]) == (2, 2)
    for pipeline in (a, b):
        row = PipelineFigures.objects.get(pipeline=pipeline)
        assert (row.collected_at, row.lag_error) == (NOW, "its Kafka connection does not exist")
        assert LagSample.objects.get(pipeline=pipeline).records is None
    later = NOW + timedelta(seconds=10)
    collector.collect(later)
    assert PipelineFigures.objects.get(pipeline=a).collected_at == later  # updated in place
    assert LagSample.objects.filter(pipeline=a).count() == 2
    figures = metrics.stored(a, later + timedelta(seconds=3))
    assert (figures["collected_at"], figures["age_seconds"]) == ("2026-11-23T12:00:10Z", 3.0)


@pytest.mark.django_db(transaction=True)  # the foreign keys are checked when the round commits
def test_a_pipeline_deleted_during_the_round_costs_only_its_own_figures(monkeypatch):
    make("stays")
    gone = make("gone")
    compute = metrics.compute

    def deleting(pipelines, now, lookups=None, **kwargs):
        out = compute(pipelines, now, lookups, **kwargs)
        Pipeline.objects.filter(pk=gone.pk).delete()
        return out

    monkeypatch.setattr(metrics, "compute", deleting)
    collector.collect(NOW)
    assert list(PipelineFigures.objects.values_list("pipeline__name", flat=True)) == ["stays"]


@pytest.mark.django_db(transaction=True)
def test_rounds_never_overlap():
    make("a")
    other = connections.create_connection("default")  # another worker's session
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [collector.ROUND_LOCK])
        assert collector.collect(NOW) == {"skipped": "another round is running"}
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [collector.ROUND_LOCK])
        assert collector.collect(NOW)["pipelines"] == 1
    finally:
        other.close()


def test_the_last_commit_shown_is_the_newest_a_running_driver_reported_since_the_round(db):
    from controlplane.definitions.models import Run

    pipeline = make("moving")
    collector.collect(NOW)
    assert metrics.stored(pipeline, NOW)["checkpoint"]["last_batch_id"] is None
    Run.objects.create(
        pipeline=pipeline,
        generation=1,
        spec_version=1,
        state="running",
        last_batch_id=41,
        last_batch_at=NOW + timedelta(seconds=8),
    )
    checkpoint = metrics.stored(pipeline, NOW + timedelta(seconds=9))["checkpoint"]
    assert (checkpoint["last_batch_id"], checkpoint["age_seconds"]) == (41, 1.0)
    assert checkpoint["last_commit_at"] == "2026-11-23T12:00:08Z"


def test_prometheus_shows_the_same_last_commit_as_the_api(db):
    from controlplane.definitions.models import Run
    from controlplane.observability.prometheus import exposition

    pipeline = make("scraped")
    collector.collect(NOW)
    Run.objects.create(
        pipeline=pipeline,
        generation=1,
        spec_version=1,
        state="running",
        last_batch_id=41,
        last_batch_at=NOW + timedelta(seconds=8),
    )
    later = NOW + timedelta(seconds=9)
    text = exposition(later).decode()
    assert 'cp_last_batch_id{pipeline="scraped"} 41.0' in text
    assert 'cp_last_commit_age_seconds{pipeline="scraped"} 1.0' in text
    assert 'cp_figures_age_seconds{pipeline="scraped"} 9.0' in text
    assert metrics.stored(pipeline, later)["checkpoint"]["last_batch_id"] == 41
