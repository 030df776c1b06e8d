"""Fixtures of the browser tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.browser.pages import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module."""
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: ./stack test installs chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
