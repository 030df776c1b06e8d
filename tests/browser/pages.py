"""Driving the dashboard in a real browser (Playwright driving Debian's Chromium): where the
browser is, signing in, the on-call controls, and the Content-Security-Policy watched on
every page."""

from __future__ import annotations

import os
import re
from pathlib import Path

from playwright.sync_api import expect

from controlplane.accounts.roles import set_role

SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
CHROMIUM = os.environ.get("CONTROLPLANE_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium tries to reach Google at every start.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# What the Content-Security-Policy blocks, Chromium reports twice: a console message
# ("Refused to ...") and a `securitypolicyviolation` event, collected here per document.
CSP_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.effectiveDirective}: ${e.blockedURI || "inline"} (${e.sourceFile}:${e.lineNumber})`
));
"""


def watch_csp(page) -> None:
    page.add_init_script(CSP_WATCH)
    page.csp_console = []
    page.on(
        "console",
        lambda m: page.csp_console.append(m.text) if "Content Security Policy" in m.text else None,
    )


def assert_no_csp_violations(page) -> None:
    """Nothing on the page (ours, htmx, uPlot) was blocked by the policy, which is there."""
    events = page.evaluate("() => window.__cspViolations")
    assert events == [] and page.csp_console == [], (events, page.csp_console)
    policy = page.evaluate(
        "async () => (await fetch(location.href)).headers.get('content-security-policy')"
    )
    assert "default-src 'self'" in policy and "'unsafe-inline'" not in policy, policy


def sign_in(browser, live_server, django_user_model, username: str, role: str):
    user = django_user_model.objects.create_user(username=username, password="pw-for-tests-1")
    set_role(user, role)
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    watch_csp(page)
    page.goto(f"{live_server.url}/")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.get_by_label("User name").fill(username)
    page.get_by_label("Password").fill("pw-for-tests-1")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("h1")).to_have_text("Pipelines")
    return page


def control(page, label: str):
    summary = page.locator("summary").filter(has_text=re.compile(f"^{label}$"))
    return page.locator("details.control").filter(has=summary)


def no_sideways_scroll(page) -> None:
    wide = page.evaluate(
        "() => [document.documentElement.scrollWidth, window.innerWidth,"
        " [...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right"
        " > window.innerWidth + 1 && !e.closest('.scroll')).map(e => e.tagName + '.' +"
        " e.className).slice(0, 5)]"
    )
    assert wide[0] <= wide[1], f"the page is {wide[0]} px wide in a {wide[1]} px window: {wide[2]}"
