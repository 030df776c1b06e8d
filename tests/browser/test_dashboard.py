"""The dashboard in a real browser (Playwright driving Debian's Chromium) against the live
server, with a real pipeline: a Spark driver launched by the reconciler, killed, restarted.

Screenshots of the overview and the pipeline page are written to docs/screenshots/.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from controlplane.definitions.models import AuditEntry, Run, RunState
from controlplane.observability.collector import collect
from controlplane.supervision import launcher, reconciler
from tests.browser.pages import SCREENSHOTS, assert_no_csp_violations, control, sign_in
from tests.kafka_helpers import produce
from tests.runs import new_pipeline

# Playwright's sync API runs an event loop in this thread; the ORM calls made here between
# browser steps are ordinary blocking calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def ticking(settings, tmp_path, live_server):
    """The control plane as it runs: drivers report to the live server; the reconciler ticks
    every half second in the background and the metrics collector every two seconds (as
    Celery beat would, faster)."""
    settings.CONTROLPLANE_URL = live_server.url
    settings.CONTROLPLANE_HEARTBEAT_SECONDS = 1
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "runs"
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    stop = threading.Event()

    def tick() -> None:
        from django.db import connection

        try:
            rounds = 0
            while not stop.is_set():
                reconciler.tick(timezone.now())
                if rounds % 4 == 0:
                    collect(timezone.now())
                rounds += 1
                stop.wait(0.5)
        finally:
            connection.close()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    yield live_server
    stop.set()
    thread.join(10)
    for run in Run.objects.filter(state__in=RunState.active()):
        launcher.kill(run)


def test_a_pipeline_killed_backs_off_and_runs_again_before_the_operators_eyes(
    browser,
    ticking,
    django_user_model,
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
):
    topic, _table = new_pipeline(
        api,
        kafka_bootstrap,
        "live",
        restart_policy={"kind": "fixed-delay", "attempts": 3, "delay_seconds": 8},
    )
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(300)))
    page = sign_in(browser, ticking, django_user_model, "olga", "operator")
    page.goto(f"{ticking.url}/pipelines/live/")
    status = page.locator("#status")
    expect(status).to_contain_text("Stopped")

    # Start it from the page: confirmed by typing its name, with a reason.
    start = control(page, "Start")
    start.locator("summary").click()
    start.get_by_label("Reason").fill("first start for the browser test")
    start.get_by_label("to confirm").fill("live")
    start.get_by_role("button", name="Start live").click()
    expect(page.locator(".flash-success")).to_contain_text("start of live requested.")
    expect(status).to_contain_text("Running", timeout=150_000)
    expect(status).to_contain_text(re.compile(r"last batch \d+"), timeout=150_000)

    page.goto(f"{ticking.url}/")
    expect(page.locator('tr[data-pipeline="live"]')).to_contain_text("Running")
    assert_no_csp_violations(page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "overview.png"), full_page=True)
    page.goto(f"{ticking.url}/pipelines/live/")

    # The driver dies (kill -9 of the JVM, as the kernel's OOM killer would).
    run = Run.objects.get(pipeline__name="live", state=RunState.RUNNING)
    driver = json.loads(Path(run.run_dir, "driver.json").read_text())["pid"]
    os.kill(driver, signal.SIGKILL)
    produce(kafka_bootstrap, topic, ({"id": f"b{i}", "n": i} for i in range(100)), start=300)
    expect(status).to_contain_text("Backing off", timeout=30_000)
    expect(status).to_contain_text(re.compile(r"Restarts it in \d+ s \(attempt 1 of 3"))
    # The cause in words on the first screen, with what to do about it.
    expect(status.locator("[data-cause]")).to_have_text("killed by signal 9 (SIGKILL)")
    expect(status).to_contain_text("OOM killer")
    page.screenshot(path=str(SCREENSHOTS / "pipeline-backing-off.png"), full_page=True)
    expect(status).to_contain_text("Running", timeout=150_000)
    expect(status).to_contain_text(re.compile(r"Run 2 .*last batch \d+", re.S), timeout=150_000)
    page.reload()
    exceptions = page.locator("section", has=page.get_by_role("heading", name="Exceptions"))
    expect(exceptions).to_contain_text("crashed")  # the exceptions history says why
    expect(exceptions.locator(".summary").first).to_have_text("killed by signal 9 (SIGKILL)")
    expect(exceptions).to_contain_text("restart 1 of 3")

    # An operator restarts it with a reason; the audit log page shows who, what and why.
    restart = control(page, "Restart")
    restart.locator("summary").click()
    restart.get_by_label("Reason").fill("INC-42: picking up the new sink password")
    restart.get_by_label("to confirm").fill("live")
    restart.get_by_role("button", name="Restart live").click()
    expect(page.locator(".flash-success")).to_contain_text("restart of live requested.")
    expect(page.locator("#charts figure.chart")).to_have_count(4)
    assert_no_csp_violations(page)
    page.screenshot(path=str(SCREENSHOTS / "pipeline.png"), full_page=True)
    page.get_by_role("link", name="Audit log").click()
    row = page.locator("tr", has_text="INC-42: picking up the new sink password")
    expect(row).to_contain_text("olga")
    expect(row).to_contain_text("restart")
    entry = AuditEntry.objects.get(pipeline_name="live", action="restart")
    assert (entry.actor_name, entry.reason) == ("olga", "INC-42: picking up the new sink password")


def test_a_viewer_has_no_controls_and_a_forged_post_is_refused(
    browser, live_server, django_user_model, pipeline
):
    page = sign_in(browser, live_server, django_user_model, "vera", "viewer")
    # The overview and the pipeline page (htmx refreshing them, uPlot drawing the charts) run
    # under the Content-Security-Policy without a violation.
    with page.expect_response(lambda r: "/pipelines/rows" in r.url):
        pass  # one htmx refresh of the overview
    assert_no_csp_violations(page)
    page.goto(f"{live_server.url}/pipelines/orders/")
    expect(page.locator("h1")).to_have_text("orders")
    expect(page.locator("#charts figure.chart")).to_have_count(4)
    with page.expect_response(lambda r: r.url.endswith("/pipelines/orders/status")):
        pass  # one htmx refresh of the status
    assert_no_csp_violations(page)
    # And the policy holds: an injected inline script is refused, and reported.
    with page.expect_console_message(lambda m: "Content Security Policy" in m.text):
        page.evaluate(
            """() => { const s = document.createElement("script");
                       s.textContent = "window.injected = true"; document.head.appendChild(s); }"""
        )
    assert page.evaluate("() => window.injected") is None
    page.wait_for_function("() => window.__cspViolations.length > 0")
    assert "script-src" in page.evaluate("() => window.__cspViolations[0]")
    page.reload()
    page.csp_console.clear()
    assert page.locator("text=On-call controls").count() == 0
    assert page.locator("details.control").count() == 0
    # The same request the operator's form sends, forged with the viewer's own session.
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{live_server.url}/pipelines/orders/control/kill",
        form={"confirm": "orders", "reason": "forged"},
        headers={"X-CSRFToken": csrf, "Referer": f"{live_server.url}/pipelines/orders/"},
    )
    assert response.status == 403
    assert "needs the operator role" in response.text().replace("<strong>", "").replace(
        "</strong>", ""
    )
    assert not AuditEntry.objects.filter(pipeline_name="orders", action="kill").exists()
    # Nor may a viewer change definitions: no links, and the forms answer 403.
    page.goto(f"{live_server.url}/")
    assert page.get_by_role("link", name="New pipeline").count() == 0
    page.goto(f"{live_server.url}/pipelines/orders/")
    assert page.get_by_role("link", name="Edit definition").count() == 0
    response = page.request.get(f"{live_server.url}/pipelines/orders/edit")
    assert response.status == 403


def field(page, label: str):
    """The form field (input, its problems, its help) whose label is `label`."""
    return page.locator("div.field").filter(has=page.get_by_label(label, exact=True))


def test_an_editor_creates_a_pipeline_with_a_mistake_corrects_it_and_edits_it(
    browser, live_server, django_user_model, kafka_connection, postgres_connection
):
    page = sign_in(browser, live_server, django_user_model, "edna", "editor")
    page.get_by_role("link", name="New pipeline").click()
    expect(page.locator("h1")).to_have_text("New pipeline")
    page.get_by_label("Name", exact=True).fill("refunds")
    page.get_by_label("Kafka connection", exact=True).select_option("events")
    page.get_by_label("Topics", exact=True).fill("refunds, not a topic!")
    page.get_by_label("Schema", exact=True).fill("id STRING, amount DOUBLE")
    page.get_by_label("Starting offsets", exact=True).fill("earliest")
    # The sink kind shows its own fields only.
    expect(page.get_by_label("Topic", exact=True)).to_be_hidden()
    page.get_by_label("Sink", exact=True).select_option("kafka")
    expect(page.get_by_label("Topic", exact=True)).to_be_visible()
    expect(page.get_by_label("Table", exact=True)).to_be_hidden()
    page.get_by_label("Sink", exact=True).select_option("postgres")
    page.get_by_label("Sink connection", exact=True).select_option("warehouse")
    page.get_by_label("Table", exact=True).fill("refunds")
    page.get_by_label("Mode", exact=True).select_option("upsert")  # and no key columns: a mistake
    page.get_by_label("Restart policy", exact=True).select_option("fixed-delay")
    page.get_by_label("Attempts", exact=True).fill("5")
    expect(
        page.get_by_label("Max backoff (s)", exact=True)
    ).to_be_hidden()  # another policy's field
    page.get_by_role("button", name="Create").click()

    # Not saved; each problem sits under its own field, and what was typed is still there.
    expect(page.locator("div.error")).to_contain_text("Not saved")
    expect(field(page, "Topics").locator(".field-errors")).to_contain_text("not a topic!")
    expect(field(page, "Key columns").locator(".field-errors")).to_contain_text("upsert")
    expect(page.get_by_label("Schema", exact=True)).to_have_value("id STRING, amount DOUBLE")
    expect(page.get_by_label("Attempts", exact=True)).to_have_value("5")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "pipeline-form-errors.png"), full_page=True)

    page.get_by_label("Topics", exact=True).fill("refunds")
    page.get_by_label("Key columns", exact=True).fill("id")
    page.get_by_role("button", name="Create").click()
    expect(page.locator(".flash-success")).to_contain_text("Pipeline refunds created")
    expect(page.locator("h1")).to_have_text("refunds")

    page.get_by_role("link", name="Edit definition").click()
    expect(page.get_by_label("Attempts", exact=True)).to_have_value("5")
    page.get_by_label("Transform (optional)", exact=True).fill(
        "SELECT id, amount FROM source WHERE amount > 0"
    )
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".flash-success")).to_contain_text("refunds is at version 2")
    expect(page.locator("pre.spec")).to_contain_text("WHERE amount > 0")
    assert_no_csp_violations(page)


def test_an_admin_adds_a_connection_whose_password_is_never_shown_again(
    browser, live_server, django_user_model, sink_dsn
):
    page = sign_in(browser, live_server, django_user_model, "ada", "admin")
    page.get_by_role("link", name="Connections").click()
    page.get_by_role("link", name="New Postgres connection").click()
    page.get_by_label("Name", exact=True).fill("dw")
    page.get_by_label("DSN", exact=True).fill("mysql://wrong")
    page.get_by_label("Password", exact=True).fill("typed-Secret-42")
    page.get_by_role("button", name="Create").click()
    expect(field(page, "DSN").locator(".field-errors")).to_contain_text("postgresql://")
    expect(page.get_by_label("Password", exact=True)).to_have_value("")  # never sent back
    assert "typed-Secret-42" not in page.content()

    page.get_by_label("DSN", exact=True).fill(sink_dsn)
    page.get_by_label("Password", exact=True).fill("typed-Secret-42")
    page.get_by_role("button", name="Create").click()
    expect(page.locator(".flash-success")).to_contain_text("Connection dw created")
    row = page.locator("tr", has_text="dw")
    expect(row).to_contain_text("password")  # which secret is set, never its value
    assert "typed-Secret-42" not in page.content()
    row.get_by_role("link", name="Edit").click()
    expect(page.get_by_label("Password", exact=True)).to_have_attribute(
        "placeholder", "set — leave empty to keep it"
    )
    assert_no_csp_violations(page)
    assert "typed-Secret-42" not in page.content()
