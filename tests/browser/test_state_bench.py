"""The state benchmark's two runs as the dashboard shows them (#18): bench/state.py's exact
distinct count over 100-byte random strings, with Spark's default (HDFS-backed) state store
and with RocksDB in the same run, a point per batch in bench/results/state.json.

Each store's series becomes its pipeline's batch progress (`distinct-hdfs`,
`distinct-rocksdb`: the bench's spec, deduplication by `s` within a one-day watermark), read
by the report API's own serializer and stored by its own function
(controlplane.observability.progress.store), each batch at the moment it ended (its
timestamp + its duration), both runs over the same ten minutes. The metrics API then answers
the same points, and each pipeline's page, in Chromium, charts them: state rows, size and
commit duration per batch, and rows per second and batch duration, on a time axis that fits
the run. Screenshots of those charts: docs/screenshots/state-bench-hdfs.png and
state-bench-rocksdb.png.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from playwright.sync_api import expect

from controlplane.api.reports import ProgressSerializer
from controlplane.definitions.models import Pipeline, Run, RunState
from controlplane.observability import progress
from controlplane.supervision import reports
from tests.browser.pages import SCREENSHOTS, assert_no_csp_violations, sign_in
from tests.factories import valid_spec

# Playwright's sync API runs an event loop in this thread; the ORM calls made here are
# ordinary blocking calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.django_db(transaction=True)

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "state.json"
COLUMNS = ["t_seconds", "commit_ms", "batch_ms", "state_rows", "size_bytes"]
STORES = ("hdfs", "rocksdb")
OPERATOR = "dedupeWithinWatermark"  # Spark's name for dropDuplicatesWithinWatermark
SIZE_METRIC = {"hdfs": "stateOnCurrentVersionSizeBytes", "rocksdb": "rocksdbSstFileSize"}


def bench_results() -> dict:
    assert RESULTS.exists(), f"{RESULTS} is missing: `python bench/state.py` writes it"
    results = json.loads(RESULTS.read_text())
    assert results["series_columns"] == COLUMNS, results["series_columns"]
    for store in STORES:
        assert len(results["stores"][store]["series"]) > 10, f"{store}: no series to chart"
    return results


def distinct_spec(store: str) -> dict:
    """bench/state.py's spec (spec_for), against the tests' connections."""
    return valid_spec(
        source={
            **valid_spec()["source"],
            "topics": ["bench-state"],
            "schema": "s STRING, ts TIMESTAMP",
            "watermark": {"column": "ts", "delay_seconds": 86400},
            "deduplicate": {"key": ["s"]},
        },
        transform={"sql": "SELECT s, ts FROM source WHERE s LIKE 'AA%'"},
        sink={"kind": "postgres", "connection": "warehouse", "table": f"bench_state_{store}"},
        trigger={"interval_seconds": 1},
        state_store=store,
    )


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def batches_of(series: list[list], store: str, started: datetime) -> list[tuple[datetime, dict]]:
    """Each point as the progress its driver reported (StreamingQueryProgress, camelCase),
    with when it was reported: as its batch ended. Every string the bench sends is new, so
    a batch's rows in are the rows it added to the state (the distinct count)."""
    out = []
    before_t, before_rows = None, 0
    for batch, (t, commit_ms, batch_ms, rows, size) in enumerate(series):
        began = started + timedelta(seconds=t)
        new = max(rows - before_rows, 0)
        out.append(
            (
                began + timedelta(milliseconds=batch_ms),
                {
                    "batchId": batch,
                    "timestamp": iso(began),
                    "numInputRows": new,
                    "inputRowsPerSecond": (
                        new / (t - before_t) if before_t is not None and t > before_t else 0.0
                    ),
                    "processedRowsPerSecond": new * 1000 / batch_ms if batch_ms else 0.0,
                    "batchDuration": batch_ms,
                    "durationMs": {"triggerExecution": batch_ms},
                    "stateOperators": [
                        {
                            "operatorName": OPERATOR,
                            "numRowsTotal": rows,
                            "commitTimeMs": commit_ms,
                            "customMetrics": {} if size is None else {SIZE_METRIC[store]: size},
                        }
                    ],
                },
            )
        )
        before_t, before_rows = t, max(before_rows, rows)
    return sorted(out, key=lambda b: b[0])


def report(run: Run, batches: list[tuple[datetime, dict]]) -> None:
    """As POST /api/runs/{id}/progress/ would, batch by batch as each ended."""
    data = ProgressSerializer(data=[p for _, p in batches], many=True)
    data.is_valid(raise_exception=True)
    with time_machine.travel(batches[0][0], tick=False) as clock:
        for (ended, _), p in zip(batches, data.validated_data, strict=True):
            clock.move_to(ended)
            progress.store(run, [p])
    ended = batches[-1][0]
    reports.batches_completed(run, max(p["batchId"] for _, p in batches), ended)
    Run.objects.filter(pk=run.pk).update(
        state=RunState.EXITED, ended_at=ended, exit_code=0, cause="stopped"
    )


def when(at: str) -> float:
    return parse_datetime(at).timestamp()


# Every chart on the page: its title, series' labels, data and time axis (charts.js keeps
# each uPlot on its figure).
CHARTS = """() => [...document.querySelectorAll("#charts figure.chart, #state-charts figure.chart")]
  .map((f) => ({ title: f.querySelector(".u-title").textContent,
                 labels: f.uplot.series.slice(1).map((s) => s.label),
                 data: f.uplot.data, x: [f.uplot.scales.x.min, f.uplot.scales.x.max] }))"""


def test_the_state_benchmark_s_two_runs_on_the_dashboard(
    browser,
    live_server,
    django_user_model,
    api,
    kafka_connection,
    postgres_connection,
):
    results = bench_results()
    series = {store: results["stores"][store]["series"] for store in STORES}
    # Both runs as they ran (the same ten minutes), ended half a minute ago.
    length = max(t + batch_ms / 1000 for s in series.values() for t, _, batch_ms, _, _ in s)
    started = timezone.now() - timedelta(seconds=length + 30)
    expected = {}
    for store in STORES:
        name = f"distinct-{store}"
        made = api.post(
            "/api/pipelines/", {"name": name, "spec": distinct_spec(store)}, format="json"
        )
        assert made.status_code == 201, made.json()
        pipeline = Pipeline.objects.get(name=name)
        Pipeline.objects.filter(pk=pipeline.pk).update(generation=1)
        run = Run.objects.create(
            pipeline=pipeline,
            generation=1,
            spec_version=1,
            state=RunState.RUNNING,
            started_at=started,
        )
        batches = batches_of(series[store], store, started)
        report(run, batches)
        expected[store] = batches

        # The metrics API answers every batch, as it was measured.
        answer = api.get(f"/api/pipelines/{name}/metrics/state/").json()
        (operator,) = answer["operators"]
        assert (operator["name"], operator["store"]) == (OPERATOR, store)
        assert operator["size_in"] == {"hdfs": "memory", "rocksdb": "disk"}[store]
        points = operator["points"]
        assert [when(p["at"]) for p in points] == pytest.approx(
            [ended.timestamp() for ended, _ in batches], abs=1e-3
        )
        state = [p["stateOperators"][0] for _, p in batches]
        assert [p["rows"] for p in points] == [o["numRowsTotal"] for o in state]
        assert [p["commit_ms"] for p in points] == [o["commitTimeMs"] for o in state]
        assert [p["size_bytes"] for p in points] == [
            o["customMetrics"].get(SIZE_METRIC[store]) for o in state
        ]
        assert operator["current"]["rows"] == results["stores"][store]["distinct_count"]

    page = sign_in(browser, live_server, django_user_model, "vic", "viewer")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for store in STORES:
        name, batches = f"distinct-{store}", expected[store]
        page.goto(f"{live_server.url}/pipelines/{name}/")
        expect(page.locator("#state tr[data-state-operator]")).to_contain_text(store)
        expect(page.locator("#charts figure.chart")).to_have_count(4)
        expect(page.locator("#state-charts figure.chart")).to_have_count(4)
        # Both answers drawn (a point per batch; no lag samples: the bench had no collector),
        # and the time axis fitted to them.
        page.wait_for_function(
            """(n) => [...document.querySelectorAll("figure.chart")].every((f) =>
                 f.uplot.data[0].length === (f.uplot.series[1].label === "lag" ? 0 : n)
                 && f.uplot.scales.x.min > Date.now() / 1000 - 1800)""",
            arg=len(batches),
        )
        charts = {c["title"]: c for c in page.evaluate(CHARTS)}
        who = f"0 · {OPERATOR}"
        xs = [ended.timestamp() for ended, _ in batches]
        state = [p["stateOperators"][0] for _, p in batches]
        assert len(charts) == 8 and charts["Lag (records)"]["data"][0] == []
        for chart in charts.values():
            if chart["title"] != "Lag (records)":
                assert chart["data"][0] == pytest.approx(xs, abs=2e-3), chart["title"]
            # The time axis: the run, not the hour (it ends now, so after the last batch).
            low, high = chart["x"]
            assert xs[0] - 60 < low <= xs[0] and high >= xs[-1], (chart["title"], low, high)
        assert charts[f"State rows ({who})"]["data"][1] == [o["numRowsTotal"] for o in state]
        size = charts[f"State bytes ({who})"]
        assert size["labels"] == ["memory", {"hdfs": "in memory", "rocksdb": "on disk"}[store]]
        assert size["data"][2] == [o["customMetrics"].get(SIZE_METRIC[store]) for o in state]
        commit = charts[f"Commit (ms) ({who})"]
        assert commit["data"][1] == [o["commitTimeMs"] for o in state]
        assert charts["Batch duration (ms)"]["data"][1] == [p["batchDuration"] for _, p in batches]
        assert charts["Rows per second"]["data"][2] == pytest.approx(
            [p["processedRowsPerSecond"] for _, p in batches]
        )
        assert_no_csp_violations(page)

        # The charts (the last hour's, then the state's) in one picture.
        page.evaluate("() => window.scrollTo(0, 0)")
        page.mouse.move(0, 0)  # no chart's cursor in the picture
        boxes = [
            page.locator("#charts-section"),
            page.locator("#state"),
        ]
        top, bottom = boxes[0].bounding_box(), boxes[1].bounding_box()
        clip = {
            "x": min(top["x"], bottom["x"]) - 8,
            "y": top["y"] - 8,
            "width": max(top["width"], bottom["width"]) + 16,
            "height": bottom["y"] + bottom["height"] - top["y"] + 16,
        }
        page.screenshot(
            path=str(SCREENSHOTS / f"state-bench-{store}.png"), clip=clip, full_page=True
        )
