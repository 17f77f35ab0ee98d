"""What every browser test shares: Debian's Chromium driven by Playwright (never a
downloaded browser), screenshots saved as artifacts, and signing in to the console."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
# How long an action, a navigation or an ``expect`` waits, in ms. Playwright's expect()
# waits 5 s unless told otherwise (a context's default timeout does not reach it): too
# little on a loaded two-core CI machine, where one 5 s poll plus its request can pass it.
TIMEOUT_MS = 15_000


@contextlib.contextmanager
def launch() -> Iterator[Any]:
    """Chromium, for as long as the block runs. Playwright's sync API keeps an asyncio loop
    on this thread while it is open, so Django would take every ORM call made here (the
    tests' own, the database flush) for one made from async code. They are not."""
    from playwright.sync_api import expect, sync_playwright

    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        expect.set_options(timeout=TIMEOUT_MS)
        try:
            yield browser
        finally:
            expect.set_options(timeout=None)  # Playwright's own default again
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in_with(page: Any, username: str, password: str) -> None:
    from playwright.sync_api import expect

    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("form.signout")).to_contain_text(username)
    # The text is there once the page is parsed; its deferred scripts (htmx, console.js)
    # and its stylesheet may still be loading. Whatever the test does next starts from a
    # page that is whole: a click on an htmx form before htmx runs is a plain POST.
    page.wait_for_load_state("load")
