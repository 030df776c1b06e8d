"""The on-call pages in a real browser (Playwright driving Debian's Chromium) against the
live server, as an operator: the Alerts page (silence a rule, acknowledge an alert), restore
points (take one, restore to it), a rollback from the spec diff, and the dead-letter page
(filter, raw values shown safely, redrive to a retry topic). Each page runs under the
Content-Security-Policy without a violation. Screenshots go to docs/screenshots/."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from controlplane.alerting.models import Alert, AlertRule
from controlplane.definitions.models import AuditEntry, Pipeline, RestorePoint
from jobs.checkpoints import read_checkpoint
from tests.browser.pages import (
    SCREENSHOTS,
    assert_no_csp_violations,
    control,
    no_sideways_scroll,
    sign_in,
)
from tests.factories import valid_spec
from tests.kafka_helpers import new_topic
from tests.spark_helpers import fake_checkpoint
from tests.test_dead_letters import left, letters  # noqa: F401

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


def test_an_operator_silences_a_rule_and_acknowledges_an_alert(
    browser,
    live_server,
    django_user_model,
    pipeline,
):
    rule = AlertRule.objects.create(name="gave-up", kind="gave-up")
    AlertRule.objects.create(name="lagging", kind="lag-seconds", params={"above": 300})
    Alert.objects.create(
        rule=rule,
        subject="orders",
        pipeline=Pipeline.objects.get(name="orders"),
        state="firing",
        message="the restart policy gave up: the pipeline is failed",
        since=timezone.now(),
        notified_at=timezone.now(),
    )
    page = sign_in(browser, live_server, django_user_model, "olga", "operator")
    page.get_by_role("link", name=re.compile("Alerts")).first.click()
    expect(page.locator("h1")).to_have_text("Alerts")
    row = page.locator('tr[data-rule="lagging"]')
    row.get_by_label("Silence for").select_option(label="4 hours")
    row.get_by_label("Reason").fill("INC-7: known slow sink")
    row.get_by_role("button", name="Silence").click()
    expect(page.locator('tr[data-rule="lagging"]')).to_contain_text("INC-7: known slow sink")
    expect(page.locator('tr[data-rule="lagging"]')).to_contain_text("until")

    alert = page.locator("tr[data-alert]")
    alert.get_by_label("Reason").fill("looking at it")
    alert.get_by_role("button", name="Acknowledge").click()
    expect(page.locator("tr[data-alert]")).to_contain_text("acknowledged by olga")
    assert Alert.objects.get().acknowledged_by.username == "olga"
    assert_no_csp_violations(page)
    page.screenshot(path=str(SCREENSHOTS / "alerts.png"), full_page=True)


def test_an_operator_takes_a_restore_point_restores_it_and_rolls_back(
    browser,
    live_server,
    django_user_model,
    pipeline,
    settings,
    tmp_path,
    api,
):
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    fake_checkpoint(tmp_path / "checkpoints" / "orders", committed=3)
    changed = valid_spec(transform={"sql": "SELECT id, amount, ts FROM source"})
    assert api.patch("/api/pipelines/orders/", {"spec": changed}, format="json").status_code == 200

    page = sign_in(browser, live_server, django_user_model, "otto", "operator")
    page.goto(f"{live_server.url}/pipelines/orders/")
    section = page.locator("#restore-points")
    section.get_by_label("Reason", exact=True).fill("before the schema change")
    section.get_by_role("button", name="Take a restore point now").click()
    point = RestorePoint.objects.get()
    expect(page.get_by_role("alert")).to_have_text(f"Restore point {point.pk} taken (batch 3).")
    row = page.locator(f'tr[data-restore-point="{point.pk}"]')
    expect(row).to_contain_text("before the schema change")

    # Batches 4..6 come; then back to the restore point.
    fake_checkpoint(tmp_path / "checkpoints" / "orders", committed=6)
    row.locator("summary", has_text="Restore…").click()
    restore = page.locator(f"#restore-point-{point.pk}")
    restore.get_by_label("Reason (kept in the audit log)").fill("INC-9: bad rows since batch 4")
    restore.get_by_label("Type orders to confirm").fill("orders")
    section.screenshot(path=str(SCREENSHOTS / "restore-points.png"))
    restore.get_by_role("button", name="Restore orders").click()
    expect(page.get_by_role("alert")).to_contain_text("orders restored to batch 3")
    assert read_checkpoint(tmp_path / "checkpoints" / "orders").last_committed.batch_id == 3
    expect(page.locator("#restore-points tr[data-restore-point]")).to_have_count(2)
    assert AuditEntry.objects.get(action="restore").reason == "INC-9: bad rows since batch 4"

    # The spec diff v1 -> v2 rolls back to v1.
    page.goto(f"{live_server.url}/pipelines/orders/diff?a=1&b=2")
    expect(page.locator("pre.diff")).to_contain_text("amount * 2")
    page.get_by_label("Reason").fill("INC-9: the new transform is wrong")
    page.get_by_label("Type orders to confirm").fill("orders")
    page.screenshot(path=str(SCREENSHOTS / "rollback.png"), full_page=True)
    page.get_by_role("button", name="Roll back to v1").click()
    expect(page.get_by_role("alert")).to_contain_text(
        "orders rolled back to the spec of version 1 (now version 3)."
    )
    assert Pipeline.objects.get(name="orders").spec == valid_spec_canonical(api)
    assert_no_csp_violations(page)


def valid_spec_canonical(api) -> dict:
    return api.get("/api/pipelines/orders/versions/1/").json()["spec"]


def test_an_operator_browses_and_redrives_dead_letters(
    browser,
    live_server,
    django_user_model,
    letters,  # noqa: F811
    kafka_bootstrap,
    sink_dsn,
):
    page = sign_in(browser, live_server, django_user_model, "oscar", "operator")
    page.goto(f"{live_server.url}/pipelines/orders/")
    page.get_by_role("link", name="browse, download, redrive").click()
    expect(page.locator("h1")).to_contain_text("Dead letters of orders")
    expect(page.locator("[data-dead-letters-total]")).to_have_text("10")
    page.get_by_label("Partition").fill("1")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("[data-dead-letters-total]")).to_have_text("5")
    # Raw values as text, never as markup; bytes that are not UTF-8 in hex.
    raw = page.locator('tr[data-dead-letter="orders/1/103"] pre.raw')
    expect(raw).to_have_text('{"id": "<b>x3</b>"}')
    assert page.locator("tr[data-dead-letter] b").count() == 0
    expect(page.locator('tr[data-dead-letter="orders/1/107"] pre.hex')).to_contain_text("ff fe")
    page.screenshot(path=str(SCREENSHOTS / "dead-letters.png"), full_page=True)
    # On a phone: nothing off screen sideways (the table scrolls inside itself).
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    no_sideways_scroll(page)
    page.screenshot(path=str(SCREENSHOTS / "dead-letters-phone.png"))
    page.set_viewport_size({"width": 1366, "height": 900})

    retry = new_topic(kafka_bootstrap, partitions=1)
    redrive = control(page, "Redrive 5 dead letters…")
    redrive.locator("summary").click()
    redrive.locator('input[name="target"][value="topic"]').check()
    redrive.locator('input[name="topic_to"]').fill(retry)
    redrive.get_by_label("Reason (kept in the audit log)").fill("schema fixed in v4")
    redrive.get_by_label("Type orders to confirm").fill("orders")
    redrive.get_by_role("button", name="Redrive").click()
    expect(page.get_by_role("alert")).to_have_text(
        f"5 dead letters written again to topic {retry}."
    )
    expect(page.locator("[data-dead-letters-total]")).to_have_text("0")
    assert [o for p, _, o in left(sink_dsn) if p == "orders"] == [100, 102, 104, 106, 108]
    assert_no_csp_violations(page)
