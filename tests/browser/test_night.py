"""On call at 3 a.m., in a real browser (Chromium), on a desktop and on a phone (390 px): the
health and the cause in words on the first screen, crash loops in red, figures that refresh in
place, nothing off screen sideways, and no accessibility violation axe-core can find.

The pipelines' states are made in the database (the real failures behind them are in
tests/browser/test_failures_in_words.py); screenshots of each state, desktop and phone, are
written to docs/screenshots/.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from controlplane.definitions.models import Failure, Pipeline, PipelineFigures, Run
from controlplane.observability import metrics
from tests.browser.pages import (
    SCREENSHOTS,
    assert_no_csp_violations,
    no_sideways_scroll,
    sign_in,
)
from tests.factories import valid_spec

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = pytest.mark.django_db(transaction=True)

AXE = Path(__file__).resolve().parents[2] / "frontend" / "node_modules" / "axe-core" / "axe.min.js"
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1366, "height": 900}

KEY = 'a definition error (the sink table has no such column): column "courier_id" named in key does not exist'  # noqa: E501
CHECK = (
    'new row for relation "loop_t" violates check constraint "reject" (Failing row contains'
    " (beta-bad, -1))"
)


def _pipeline(api, name: str, *, status: str, desired: str = "running", **fields) -> Pipeline:
    response = api.post("/api/pipelines/", {"name": name, "spec": valid_spec()}, format="json")
    assert response.status_code == 201, response.json()
    Pipeline.objects.filter(name=name).update(status=status, desired_state=desired, **fields)
    return Pipeline.objects.get(name=name)


def _figures(pipeline: Pipeline, *, lag: int, committed_ago: float | None) -> None:
    now = timezone.now()
    figures = metrics.empty_figures()
    figures["lag"].update(records=lag, seconds=lag / 200, error="", status="ok")
    last = now - timedelta(seconds=committed_ago) if committed_ago is not None else None
    figures["checkpoint"].update(
        last_batch_id=41 if last else None,
        last_commit_at=last.isoformat() if last else None,
        source="checkpoint",
    )
    figures["backpressure"] = {"level": "low", "busy_ratio": 0.6, "reason": "batches take 60 %"}
    PipelineFigures.objects.update_or_create(
        pipeline=pipeline,
        defaults={
            "collected_at": now,
            "figures": figures,
            "lag_records": lag,
            "lag_seconds": lag / 200,
            "lag_status": "ok",
            "backpressure": "low",
            "last_commit_at": last,
        },
    )


@pytest.fixture
def night(api, kafka_connection, postgres_connection):
    """A fleet at 3 a.m.: a pipeline that gave up on a key column that does not exist, a
    shared application's member crash-looping on a row its table refuses (status running),
    one backing off, one healthy, one stopped."""
    now = timezone.now()
    failed = _pipeline(api, "courier-keys", status="failed", attempt=1)
    Failure.objects.create(
        pipeline=failed,
        at=now - timedelta(minutes=3),
        cause="crashed",
        message="pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED]"
        " [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function"
        " in foreach batch sink. " + "x" * 3000 + f"\npsycopg.errors.UndefinedColumn: {KEY}",
        reason=KEY,
        category="unknown-column",
        permanent=True,
        decision=f"gave up: {KEY} (permanent: restarting cannot fix it)",
    )
    loop = _pipeline(api, "member-loop", status="running", attempt=3, restarts=3)
    run = Run.objects.create(
        pipeline=loop, generation=4, spec_version=1, state="running", started_at=now
    )
    for i, ago in enumerate((100, 60, 20)):
        Failure.objects.create(
            pipeline=loop,
            at=now - timedelta(seconds=ago),
            cause="crashed",
            message=f"psycopg.errors.CheckViolation: {CHECK}",
            reason=f"CheckViolation: {CHECK}",
            category="constraint",
            decision=f"restart {i + 1} of 10 (fixed-delay(attempts 10, delay 1 s))",
        )
    Pipeline.objects.filter(pk=loop.pk).update(generation=run.generation)
    _figures(loop, lag=120, committed_ago=300)
    backing = _pipeline(
        api,
        "slow-start",
        status="backing-off",
        attempt=1,
        next_attempt_at=now + timedelta(minutes=5),
    )
    Failure.objects.create(
        pipeline=backing,
        at=now - timedelta(seconds=5),
        cause="crashed",
        message='psycopg.OperationalError: connection to server at "10.0.0.7", port 5432'
        " failed: Connection refused",
        reason="a database or broker refused the connection: connection to server at"
        ' "10.0.0.7", port 5432 failed: Connection refused',
        category="connection-lost",
        decision="restart 1 of 3 (fixed-delay(attempts 3, delay 10 s))",
    )
    healthy = _pipeline(api, "orders-live", status="running")
    Run.objects.create(
        pipeline=healthy,
        generation=1,
        spec_version=1,
        state="running",
        started_at=now - timedelta(hours=2),
        last_batch_id=41,
        last_batch_at=now,
    )
    _figures(healthy, lag=35, committed_ago=1)
    _pipeline(api, "archive", status="stopped", desired="stopped")
    return {"failed": failed, "loop": loop, "backing": backing, "healthy": healthy}


def on_first_screen(page, selector: str) -> None:
    box = page.locator(selector).first.bounding_box()
    height = page.viewport_size["height"]
    assert box is not None and box["y"] + box["height"] <= height, (selector, box, height)


def axe_violations(page) -> list:
    page.evaluate(AXE.read_text())
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [
        (v["id"], v["help"], [n["target"] for n in v["nodes"]][:3]) for v in found
    ]  # fmt: skip


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_the_overview_puts_the_crash_loop_in_red_with_its_cause(
    browser, live_server, django_user_model, night, size
):
    page = sign_in(browser, live_server, django_user_model, f"nora-{size}", "operator")
    page.set_viewport_size(PHONE if size == "phone" else DESKTOP)
    page.goto(f"{live_server.url}/")
    loop = page.locator('tr[data-pipeline="member-loop"]')
    expect(loop).to_have_attribute("data-health", "crash-looping")
    expect(loop.locator(".health")).to_have_text("✖ crash-looping")
    expect(loop).to_contain_text("3 failures in 10 min: CheckViolation: new row for relation")
    failed = page.locator('tr[data-pipeline="courier-keys"]')
    expect(failed).to_contain_text('column "courier_id" named in key does not exist')
    names = page.locator("tr[data-pipeline]").evaluate_all(
        "rows => rows.map(r => r.dataset.pipeline)"
    )
    assert names[:2] == ["courier-keys", "member-loop"] and names[-1] == "archive", names
    expect(page.locator('tr[data-pipeline="orders-live"]')).to_have_attribute(
        "data-health", "healthy"
    )
    # Low backpressure is no warning, and on a phone it is beside the lag.
    low = page.locator('tr[data-pipeline="orders-live"] .bp-low').filter(visible=True)
    expect(low).to_have_count(1)
    assert low.evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(238, 241, 246)"
    on_first_screen(page, 'tr[data-pipeline="member-loop"] .health')
    no_sideways_scroll(page)
    assert_no_csp_violations(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"overview-night-{size}.png"), full_page=True)


# Each state's page: (pipeline, health, words of its cause, words of what comes next).
STATES = [
    ("courier-keys", "failed", 'column "courier_id" named in key', "it gave up restarting"),
    ("member-loop", "crash-looping", "violates check constraint", "after each failure"),
    ("slow-start", "recovering", "Connection refused", "Restarts it in"),
    ("orders-live", "healthy", None, None),
]


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_the_pipeline_page_leads_with_health_cause_fix_and_what_comes_next(
    browser, live_server, django_user_model, night, size
):
    page = sign_in(browser, live_server, django_user_model, f"nick-{size}", "operator")
    page.set_viewport_size(PHONE if size == "phone" else DESKTOP)
    for name, health, cause, next_step in STATES:
        page.goto(f"{live_server.url}/pipelines/{name}/")
        status = page.locator("#status")
        expect(status).to_have_attribute("data-health", health)
        on_first_screen(page, "#status .health")
        page.screenshot(path=str(SCREENSHOTS / f"pipeline-{health}-{size}.png"))
        if cause:
            expect(status.locator("[data-cause]")).to_contain_text(cause)
            on_first_screen(page, "#status [data-cause]")
            expect(status.locator(".fix")).not_to_be_empty()
            # The full message is one click away, whole.
            status.get_by_role("link", name="full message").click()
            message = page.locator("#exceptions details.message").first
            message.locator("summary").click()
            expect(message.locator("pre")).to_be_visible()
        if next_step:
            expect(status.locator("[data-next-step]")).to_contain_text(next_step)
        # Only the controls that make sense now.
        summaries = page.locator("section.controls summary").all_inner_texts()
        if health in ("failed", "recovering"):
            assert "Start" in summaries, (name, summaries)
        else:
            assert "Start" not in summaries and "Stop" in summaries, (name, summaries)
        if name == "slow-start":
            assert "Restart now" in summaries, summaries
        no_sideways_scroll(page)
        assert_no_csp_violations(page)


def test_the_figures_and_ages_refresh_in_place(browser, live_server, django_user_model, night):
    page = sign_in(browser, live_server, django_user_model, "nadia", "viewer")
    page.goto(f"{live_server.url}/pipelines/orders-live/")
    now_section = page.locator("#now")
    expect(now_section.locator("[data-lag]")).to_contain_text("35 records")
    page.evaluate("() => { window.notReloaded = true; }")
    # The collector's next round: more lag, and it is in the page without a reload.
    _figures(night["healthy"], lag=4321, committed_ago=2)
    expect(now_section.locator("[data-lag]")).to_contain_text("4321 records", timeout=15_000)
    assert page.evaluate("() => window.notReloaded") is True
    # Ages tick by the page's clock.
    age = page.locator("#now [data-last-commit] time[data-ago]")
    before = age.inner_text()
    expect(age).not_to_have_text(before, timeout=5_000)


MAIN_PAGES = [
    "/",
    "/pipelines/member-loop/",
    "/pipelines/courier-keys/",
    "/pipelines/orders-live/",
    "/applications/",
    "/alerts/",
    "/connections/",
    "/audit/",
]


def test_axe_finds_no_accessibility_violation(browser, live_server, django_user_model, night):
    page = sign_in(browser, live_server, django_user_model, "alex", "operator")
    found = {}
    for path in MAIN_PAGES:
        page.goto(f"{live_server.url}{path}")
        found[path] = axe_violations(page)
    assert found == {path: [] for path in MAIN_PAGES}


def test_the_api_and_prometheus_say_the_same(api, night):
    body = api.get("/api/pipelines/member-loop/").json()
    assert body["health"]["state"] == "crash-looping" and body["health"]["colour"] == "red"
    assert body["health"]["cause"]["category"] == "constraint"
    assert "violates check constraint" in body["health"]["cause"]["summary"]
    listed = {p["name"]: p["health"]["state"] for p in api.get("/api/pipelines/").json()["results"]}
    assert listed == {
        "archive": "stopped",
        "courier-keys": "failed",
        "member-loop": "crash-looping",
        "orders-live": "healthy",
        "slow-start": "recovering",
    }
    failed = api.get("/api/pipelines/courier-keys/").json()
    assert failed["last_failure"]["summary"] == KEY
    assert "ALTER TABLE" in failed["last_failure"]["fix"]
    text = api.get("/metrics").content.decode()
    assert 'cp_pipeline_health{pipeline="member-loop",state="crash-looping"} 1.0' in text
    assert 'cp_pipeline_red{pipeline="member-loop"} 1.0' in text
    assert 'cp_pipeline_red{pipeline="orders-live"} 0.0' in text
    assert json.dumps(body)  # serializable as it is


def test_the_charts_fetch_only_what_is_new_and_take_a_range(
    browser, live_server, django_user_model, night
):
    from controlplane.definitions.models import BatchProgress

    run = Run.objects.get(pipeline=night["healthy"])
    now = timezone.now()
    for i in range(5):
        row = BatchProgress.objects.create(
            run=run,
            batch_id=37 + i,
            timestamp=now - timedelta(minutes=5 - i),
            num_input_rows=200,
            input_rows_per_second=200,
            processed_rows_per_second=400,
            batch_duration_ms=300,
        )
        BatchProgress.objects.filter(pk=row.pk).update(reported_at=now - timedelta(minutes=5 - i))
    newest = now - timedelta(minutes=1)
    asked = []
    page = sign_in(browser, live_server, django_user_model, "cora", "viewer")
    page.on("request", lambda r: asked.append(r.url) if "/metrics/history/" in r.url else None)
    page.goto(f"{live_server.url}/pipelines/orders-live/")
    expect(page.locator("#charts figure.chart")).to_have_count(4)

    def since(url: str):
        from datetime import datetime
        from urllib.parse import parse_qs, urlsplit

        return datetime.fromisoformat(parse_qs(urlsplit(url).query)["since"][0])

    # The whole hour first; then, 10 s later, only what came after the newest point drawn.
    assert abs((since(asked[0]) - (now - timedelta(hours=1))).total_seconds()) < 30
    with page.expect_request(lambda r: "/metrics/history/" in r.url, timeout=20_000):
        pass
    assert abs((since(asked[-1]) - newest).total_seconds()) < 1, asked
    rows = page.evaluate(
        "() => document.querySelector('#charts figure.chart').uplot.data[0].length"
    )
    assert rows == 5  # nothing drawn twice
    # A range: fetched whole.
    with page.expect_request(lambda r: "/metrics/history/" in r.url):
        page.get_by_label("Range").select_option("86400")
    assert abs((since(asked[-1]) - (now - timedelta(hours=24))).total_seconds()) < 30


def test_the_swagger_ui_shows_the_api_under_the_content_security_policy(
    browser, live_server, django_user_model
):
    page = sign_in(browser, live_server, django_user_model, "sam", "viewer")
    page.goto(f"{live_server.url}/api/schema/swagger-ui/")
    expect(page.locator(".swagger-ui .title")).to_contain_text("Streaming control plane API")
    expect(page.locator("#operations-api-pipelines_preflight")).to_have_count(1)
    # Nothing blocked; scripts only from this site's files (Swagger UI sets styles inline:
    # drf-spectacular allows inline styles on this page alone, never inline scripts).
    assert page.evaluate("() => window.__cspViolations") == [] and page.csp_console == []
    policy = page.evaluate(
        "async () => (await fetch(location.href)).headers.get('content-security-policy')"
    )
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())
    assert directives["script-src"] == "'self'", policy
