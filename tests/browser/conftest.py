"""Browser tier: headless Chromium (Debian's, installed by ``make system-deps``) driven by
Playwright against the session's real hub (the hub tier's fixtures ``hub`` and ``notebook_nodes``,
one instance per session: tests/support/hub_session.py, registered in tests/conftest.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

# Screenshots land in OUT (repository's out/browser, ignored by git; GPUSHARE_BROWSER_OUT overrides).
from tests.support.pictures import OUT


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail("no chromium on PATH: run `make system-deps` (apt-get install chromium)", pytrace=False)


@pytest.fixture
def browser_page() -> Iterator[Any]:
    """A fresh page of a headless Chromium (one browser per test, so no cookie carries over)."""
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
        )
        try:
            context = browser.new_context(viewport={"width": 1100, "height": 900})
            context.set_default_timeout(60_000)
            yield context.new_page()
        finally:
            browser.close()


def login(page: Any, hub_url: str, user: str) -> None:
    """Sign in on the hub's login page as a person would (DummyAuthenticator: any password)."""
    page.goto(f"{hub_url}/hub/login")
    page.fill("input[name=username]", user)
    if page.locator("input[name=password]").count():
        page.fill("input[name=password]", "any")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/**")
