"""Progress history stays bounded: raw rows become hourly roll-ups, which expire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.definitions.models import BatchProgress, Pipeline, ProgressRollup, Run
from controlplane.observability.retention import compact_progress

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def progress(run, batch_id, at, rows=100, duration=500):
    row = BatchProgress.objects.create(
        run=run,
        batch_id=batch_id,
        timestamp=at,
        num_input_rows=rows,
        input_rows_per_second=rows / 2,
        processed_rows_per_second=rows,
        batch_duration_ms=duration,
    )
    BatchProgress.objects.filter(pk=row.pk).update(reported_at=at)  # auto_now_add otherwise


def test_old_progress_is_summed_per_hour_and_recent_progress_kept_raw(pipeline, settings):
    settings.CONTROLPLANE_PROGRESS_RAW_HOURS = 24
    settings.CONTROLPLANE_PROGRESS_ROLLUP_DAYS = 30
    run = Run.objects.create(
        pipeline=Pipeline.objects.get(name="orders"), generation=1, spec_version=1
    )
    old_hour = NOW - timedelta(hours=30)
    progress(run, 1, old_hour + timedelta(minutes=1), rows=100, duration=400)
    progress(run, 2, old_hour + timedelta(minutes=2), rows=300, duration=900)
    progress(run, 3, old_hour + timedelta(hours=1, minutes=5), rows=50)
    progress(run, 4, NOW - timedelta(hours=1), rows=7)  # recent: stays raw

    assert compact_progress(NOW)["rolled_up"] == 3
    assert list(BatchProgress.objects.values_list("batch_id", flat=True)) == [4]
    first, second = ProgressRollup.objects.order_by("bucket_start")
    assert (first.bucket_start, first.batches, first.input_rows) == (old_hour, 2, 400)
    assert (first.sum_batch_duration_ms, first.max_batch_duration_ms) == (1300, 900)
    assert (second.batches, second.input_rows) == (1, 50)

    # Again: nothing is counted twice; a late row for an hour already rolled up is added.
    progress(run, 5, old_hour + timedelta(minutes=30), rows=1)
    assert compact_progress(NOW)["rolled_up"] == 1
    first.refresh_from_db()
    assert (first.batches, first.input_rows) == (3, 401)

    # A month later everything has aged: batch 4 is rolled up too, and every roll-up
    # older than its retention goes.
    assert compact_progress(NOW + timedelta(days=31))["expired_rollups"] == 3
    assert not BatchProgress.objects.exists()
    assert not ProgressRollup.objects.exists()


def test_history_shows_hourly_roll_ups_before_the_raw_batches(api, pipeline, settings):
    settings.CONTROLPLANE_PROGRESS_RAW_HOURS = 24
    settings.CONTROLPLANE_PROGRESS_ROLLUP_DAYS = 30
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    run = Run.objects.create(
        pipeline=Pipeline.objects.get(name="orders"), generation=1, spec_version=1
    )
    old_hour = (now - timedelta(hours=30)).replace(minute=0)
    progress(run, 1, old_hour + timedelta(minutes=1), rows=100, duration=400)
    progress(run, 2, old_hour + timedelta(minutes=2), rows=300, duration=900)
    progress(run, 3, now - timedelta(hours=40), rows=5)  # before `since` below
    progress(run, 4, now - timedelta(hours=1), rows=7)
    progress(run, 5, now - timedelta(minutes=1), rows=9)
    compact_progress(now)

    since = (now - timedelta(hours=31)).isoformat()
    response = api.get("/api/pipelines/orders/metrics/history/", {"since": since})
    assert response.status_code == 200
    points = response.json()["points"]
    assert [(p["resolution"], p["batch_id"], p["input_rows"]) for p in points] == [
        ("hour", None, 400),
        ("batch", 4, 7),
        ("batch", 5, 9),
    ]
    hour = points[0]
    assert hour["at"].startswith(old_hour.strftime("%Y-%m-%dT%H:00:00"))
    assert (hour["batches"], hour["batch_duration_ms"], hour["max_batch_duration_ms"]) == (
        2,
        650,
        900,
    )
    assert hour["input_rows_per_second"] == 100  # the mean of 50 and 150
    trigger = Pipeline.objects.get(name="orders").trigger_seconds
    assert hour["busy_ratio"] == 650 / (trigger * 1000)


def test_figures_read_at_most_the_newest_batches_of_each_window(pipeline):
    from controlplane.observability.metrics import RECENT_BATCHES, _recent_batches

    now = datetime.now(UTC)
    row = Pipeline.objects.get(name="orders")
    run = Run.objects.create(pipeline=row, generation=1, spec_version=1)
    BatchProgress.objects.bulk_create(
        BatchProgress(run=run, batch_id=i, timestamp=now, num_input_rows=1)
        for i in range(RECENT_BATCHES + 50)
    )
    recent = _recent_batches([row], now)[row.pk]
    assert [p["batch_id"] for p in recent] == list(range(50, RECENT_BATCHES + 50))
    assert not any(p["first"] for p in recent)  # batch 0, the run's first, is not among them


def test_old_lag_samples_are_dropped(pipeline, settings):
    from controlplane.definitions.models import LagSample

    settings.CONTROLPLANE_LAG_SAMPLE_HOURS = 48
    row = Pipeline.objects.get(name="orders")
    for hours in (49, 47, 1):
        LagSample.objects.create(pipeline=row, at=NOW - timedelta(hours=hours), records=hours)
    assert compact_progress(NOW)["expired_lag_samples"] == 1
    assert sorted(LagSample.objects.values_list("records", flat=True)) == [1, 47]


def test_old_state_samples_are_summed_per_hour_and_shown_before_the_raw_ones(
    api, pipeline, settings
):
    from controlplane.definitions.models import StateRollup, StateSample
    from controlplane.observability import state
    from tests.clients import HDFS, ROCKSDB, stateful

    settings.CONTROLPLANE_PROGRESS_RAW_HOURS = 24
    settings.CONTROLPLANE_PROGRESS_ROLLUP_DAYS = 30
    now = datetime.now(UTC).replace(minute=30, second=0, microsecond=0)
    run = Run.objects.create(
        pipeline=Pipeline.objects.get(name="orders"), generation=1, spec_version=1,
        last_batch_id=5,
    )  # fmt: skip
    old_hour = (now - timedelta(hours=30)).replace(minute=0)

    def batch(i, at, rows, dropped, commit):
        rocks = {**ROCKSDB, "numRowsTotal": rows, "numRowsDroppedByWatermark": dropped,
                 "commitTimeMs": commit}  # fmt: skip
        return (run, stateful(i, rocks, HDFS), at)

    state.store(
        [
            batch(1, old_hour + timedelta(minutes=1), 1_000, 3, 40),
            batch(2, old_hour + timedelta(minutes=2), 3_000, 4, 90),
            batch(3, now - timedelta(hours=1), 5_000, 0, 10),
            batch(4, now - timedelta(minutes=1), 7_000, 1, 20),
        ]
    )
    summary = compact_progress(now)
    assert (summary["state_rolled_up"], summary["expired_state_rollups"]) == (4, 0)
    assert StateSample.objects.count() == 4  # two recent batches, two operators
    hour = StateRollup.objects.get(operator=0)
    assert (hour.bucket_start, hour.name, hour.store, hour.batches) == (
        old_hour, "stateStoreSave", "rocksdb", 2,
    )  # fmt: skip
    assert (hour.sum_rows, hour.max_rows, hour.rows_dropped, hour.max_commit_ms) == (
        4_000, 3_000, 7, 90,
    )  # fmt: skip
    assert (hour.sized_batches, hour.sum_size_bytes, hour.checkpointed_batches) == (2, 18e6, 2)

    since = (now - timedelta(hours=31)).isoformat()
    body = api.get("/api/pipelines/orders/metrics/state/", {"since": since}).json()
    rocks = body["operators"][0]
    assert [(p["resolution"], p["batch_id"], p["rows"]) for p in rocks["points"]] == [
        ("hour", None, 2_000),
        ("batch", 3, 5_000),
        ("batch", 4, 7_000),
    ]
    assert (rocks["points"][0]["max_rows"], rocks["points"][0]["rows_dropped"]) == (3_000, 7)
    assert rocks["points"][0]["commit_ms"] == 65
    assert rocks["points"][0]["size_bytes"] == 9e6

    # A month later the roll-ups are gone too.
    later = compact_progress(now + timedelta(days=31))
    assert later["expired_state_rollups"] == 6  # two operators, three hours
    assert not StateSample.objects.exists() and not StateRollup.objects.exists()
