"""State you can see: the stateful operators drivers report with each batch are kept per
operator (RocksDB or the HDFS-backed store, told apart), counted once, refused with field
errors when malformed, and shown by the metrics API, its state series and Prometheus."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.accounts.models import digest
from controlplane.definitions.models import (
    BatchProgress,
    Pipeline,
    Run,
    SparkApplication,
    StateOperator,
    StateSample,
)
from controlplane.observability import state
from tests.clients import HDFS, PROGRESS, ROCKSDB, driver, stateful


def post(run, body, key="tok-1"):
    return driver(key).post(f"/api/runs/{run.pk}/progress/", body, format="json")


def test_each_operator_s_state_is_kept_per_batch_with_its_store(running):
    assert post(running, stateful(3)).status_code == 200
    rocks, hdfs = StateSample.objects.order_by("operator")
    assert (rocks.operator, rocks.name, rocks.store, rocks.batch_id) == (
        0,
        "stateStoreSave",
        "rocksdb",
        3,
    )
    assert (rocks.rows, rocks.rows_updated, rocks.rows_removed) == (1500, 120, 30)
    assert (rocks.memory_bytes, rocks.size_bytes, rocks.rows_dropped) == (250_000, 9_000_000, 7)
    assert (rocks.commit_ms, rocks.checkpoint_ms, rocks.store_checkpoint_ms) == (41, 16, 6)
    # The default store: its size is its current version's, in memory; no RocksDB latency.
    assert (hdfs.name, hdfs.store, hdfs.size_bytes, hdfs.store_checkpoint_ms) == (
        "dedupeWithinWatermark",
        "hdfs",
        21_000,
        None,
    )
    assert (rocks.pipeline_id, rocks.at) == (running.pipeline_id, running.batches.get().reported_at)
    # The batch's sums are kept as before.
    assert (running.batches.get().state_rows, running.batches.get().state_memory_bytes) == (
        1580,
        310_000,
    )


def test_a_job_that_reports_no_state_stores_none_and_costs_nothing_more(running):
    with CaptureQueriesContext(connection) as queries:
        assert post(running, PROGRESS).status_code == 200
        assert post(running, {**PROGRESS, "batchId": 4, "stateOperators": []}).status_code == 200
    tables = ("pipelines_statesample", "pipelines_stateoperator", "pipelines_staterollup")
    assert not [q for q in queries if any(t in q["sql"] for t in tables)]
    assert BatchProgress.objects.count() == 2
    assert not StateSample.objects.exists() and not StateOperator.objects.exists()


def test_late_rows_are_counted_once_whatever_is_sent_again(running):
    assert post(running, [stateful(3), stateful(4)]).status_code == 200
    assert post(running, [stateful(4), stateful(5)]).status_code == 200  # a retry overlapping
    assert post(running, stateful(3)).status_code == 200  # an old batch, again
    rows = {o.operator: o for o in StateOperator.objects.all()}
    assert (rows[0].rows_dropped_total, rows[1].rows_dropped_total) == (21, 6)
    assert (rows[0].batch_id, rows[0].latest["rows"]) == (5, 1500)
    assert StateSample.objects.count() == 6  # three batches, two operators


def test_another_query_shape_starts_its_own_totals_and_drops_the_former_operators(
    running,
):
    assert post(running, stateful(3)).status_code == 200
    # The next run (a new spec version) keeps one operator, of another kind.
    Run.objects.filter(pk=running.pk).update(state="exited")
    Pipeline.objects.filter(pk=running.pipeline_id).update(generation=2)
    second = Run.objects.create(
        pipeline_id=running.pipeline_id, generation=2, spec_version=2, state="running",
        token_digest=digest("tok-2"),
    )  # fmt: skip
    other = {**ROCKSDB, "operatorName": "dedupe", "numRowsDroppedByWatermark": 1}
    assert post(second, stateful(4, other), key="tok-2").status_code == 200
    (row,) = StateOperator.objects.all()
    assert (row.operator, row.name, row.rows_dropped_total, row.run_id) == (
        0,
        "dedupe",
        1,
        second.pk,
    )


@pytest.mark.parametrize(
    ("operator", "errors"),
    [
        ({"numRowsTotal": -1}, {"stateOperators.0.numRowsTotal"}),
        ({"numRowsTotal": "many"}, {"stateOperators.0.numRowsTotal"}),
        ({"numRowsTotal": 2**63}, {"stateOperators.0.numRowsTotal"}),  # not a BIGINT
        ({"memoryUsedBytes": 1.5}, {"stateOperators.0.memoryUsedBytes"}),
        ({"operatorName": "x" * 101}, {"stateOperators.0.operatorName"}),
        (
            {"customMetrics": {"rocksdbSstFileSize": "big"}},
            {"stateOperators.0.customMetrics.rocksdbSstFileSize"},
        ),
        (
            {"customMetrics": {"stateOnCurrentVersionSizeBytes": 2**64}},
            {"stateOperators.0.customMetrics.stateOnCurrentVersionSizeBytes"},
        ),
        ({"customMetrics": [1, 2]}, {"stateOperators.0.customMetrics"}),
    ],
)
def test_malformed_state_gets_field_errors_and_nothing_is_kept(
    running,
    operator,
    errors,
):
    response = post(running, stateful(3, {**ROCKSDB, **operator}))
    assert response.status_code == 400, response.content
    assert set(response.json()) == errors
    assert not BatchProgress.objects.exists() and not StateSample.objects.exists()


def test_state_that_is_not_a_list_of_objects_is_refused(running):
    for bad in ("lots", [1], [None], {"operatorName": "x"}, [ROCKSDB] * 65):
        response = post(running, {**PROGRESS, "stateOperators": bad})
        assert response.status_code == 400, (bad, response.content)
        assert all(k.startswith("stateOperators") for k in response.json()), response.json()
    # Unknown custom metrics, and figures Spark leaves out, are fine.
    # So is a phase that no column could hold: it is not kept.
    sparse = {"operatorName": "x", "customMetrics": {"somethingNew": {"nested": True}}}
    odd = {"walCommit": 2**70, "commitOffsets": -3}
    assert post(running, stateful(3, sparse, durationMs=odd)).status_code == 200
    (sample,) = StateSample.objects.all()
    assert (sample.store, sample.rows, sample.size_bytes) == ("", None, None)
    assert sample.checkpoint_ms is None


def test_a_shared_application_s_members_report_state_too(pipeline):
    app = SparkApplication.objects.create(
        name="shared", desired_state="running", status="running", generation=1,
        token_digest=digest("app-tok"),
    )  # fmt: skip
    Pipeline.objects.update(desired_state="running", status="running", generation=1)
    run = Run.objects.create(
        pipeline=Pipeline.objects.get(name="orders"), generation=1, spec_version=1,
        state="running", token_digest=digest("tok-o"), application=app,
        application_generation=1,
    )  # fmt: skip
    bad = {**ROCKSDB, "numRowsTotal": -5}
    response = driver("app-tok").post(
        "/api/applications/shared/reports/",
        {
            "reports": [
                {"run_id": run.pk, "token": "tok-o", "kind": "progress", "body": stateful(3)},
                {"run_id": run.pk, "token": "tok-o", "kind": "progress", "body": stateful(4, bad)},
            ]
        },
        format="json",
    )
    assert response.status_code == 200
    first, second = response.json()["answers"]
    assert first["status"] == 200
    assert second["status"] == 400 and "numRowsTotal" in str(second["body"])
    assert sorted(StateSample.objects.values_list("batch_id", "operator")) == [(3, 0), (3, 1)]


def test_the_metrics_api_shows_each_operator_now(api, running):
    assert api.get("/api/pipelines/orders/metrics/").json()["state"] == []
    assert post(running, [stateful(3), stateful(4)]).status_code == 200
    rocks, hdfs = api.get("/api/pipelines/orders/metrics/").json()["state"]
    assert {k: rocks[k] for k in ("operator", "name", "store", "size_in", "batch_id")} == {
        "operator": 0,
        "name": "stateStoreSave",
        "store": "rocksdb",
        "size_in": "disk",
        "batch_id": 4,
    }
    assert (rocks["rows"], rocks["size_bytes"], rocks["rows_dropped_total"]) == (1500, 9e6, 14)
    assert (hdfs["store"], hdfs["size_in"], hdfs["size_bytes"]) == ("hdfs", "memory", 21_000)


def test_the_state_series_come_per_operator_with_their_trend(api, running):
    now = datetime.now(UTC)
    for i in range(40):  # every 10 minutes for the last 6.5 h, growing
        at = now - timedelta(minutes=10 * (39 - i))
        grown = {**ROCKSDB, "numRowsTotal": 10_000 + 1_000 * i}
        state.store([(running, stateful(10 + i, grown, HDFS), at)])
    Run.objects.filter(pk=running.pk).update(last_batch_id=49)
    body = api.get(
        "/api/pipelines/orders/metrics/state/",
        {"since": (now - timedelta(hours=1, minutes=1)).isoformat(), "hours": 6},
    ).json()
    assert body["hours"] == 6
    rocks, hdfs = body["operators"]
    assert (rocks["operator"], rocks["name"], rocks["store"], rocks["size_in"]) == (
        0,
        "stateStoreSave",
        "rocksdb",
        "disk",
    )
    assert [p["rows"] for p in rocks["points"]] == [
        10_000 + 1_000 * i for i in range(33, 40)
    ]  # the last hour, oldest first
    point = rocks["points"][-1]
    assert (point["resolution"], point["batch_id"], point["run"]) == ("batch", 49, 1)
    assert (point["commit_ms"], point["checkpoint_ms"], point["rows_dropped"]) == (41, 16, 7)
    assert rocks["current"]["rows"] == 49_000 and rocks["current"]["rows_dropped_total"] == 280
    assert rocks["trend"]["grows_without_bound"] is True
    assert rocks["trend"]["rows_per_hour"] == pytest.approx(6_000, rel=0.02)
    assert hdfs["trend"]["grows_without_bound"] is False  # 80 rows all along
    assert hdfs["trend"]["rows_per_hour"] == 0


def test_a_pipeline_without_state_has_no_series_and_bad_parameters_are_named(
    api,
    pipeline,
):
    assert api.get("/api/pipelines/orders/metrics/state/").json()["operators"] == []
    for query, field in (
        ({"since": "yesterday"}, "since"),
        ({"hours": "0"}, "hours"),
        ({"hours": "many"}, "hours"),
        ({"hours": "nan"}, "hours"),
        ({"hours": "100000"}, "hours"),
    ):
        response = api.get("/api/pipelines/orders/metrics/state/", query)
        assert response.status_code == 400
        assert list(response.json()) == [field]


def test_prometheus_shows_each_operator_with_help(api, running):
    assert post(running, [stateful(3), stateful(4)]).status_code == 200
    Run.objects.filter(pk=running.pk).update(last_batch_id=4)
    text = api.get("/metrics").content.decode()
    rocks = 'operator="0",operator_name="stateStoreSave",pipeline="orders",store="rocksdb"'
    hdfs = 'operator="1",operator_name="dedupeWithinWatermark",pipeline="orders",store="hdfs"'
    for line in (
        f"cp_state_rows{{{rocks}}} 1500.0",
        f"cp_state_memory_bytes{{{rocks}}} 250000.0",
        f"cp_state_disk_bytes{{{rocks}}} 9e+06",
        f"cp_state_commit_ms{{{rocks}}} 41.0",
        f"cp_state_rows_dropped_by_watermark_total{{{rocks}}} 14.0",
        f"cp_state_rows{{{hdfs}}} 80.0",
        f"cp_state_rows_dropped_by_watermark_total{{{hdfs}}} 4.0",
        "# TYPE cp_state_rows_dropped_by_watermark_total counter",
        "# HELP cp_state_disk_bytes size on disk of a RocksDB state store's SST files",
    ):
        assert line in text, line
    assert f"cp_state_disk_bytes{{{hdfs}}}" not in text  # in memory: not a disk size
    # The next run keeps no state (a stateless spec): its predecessor's operators go.
    Run.objects.filter(pk=running.pk).update(state="exited")
    Run.objects.create(
        pipeline_id=running.pipeline_id, generation=2, spec_version=2, last_batch_id=0
    )
    text = api.get("/metrics").content.decode()
    assert "cp_state_rows{" not in text
    assert api.get("/api/pipelines/orders/metrics/").json()["state"] == []
