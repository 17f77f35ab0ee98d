"""Shared console fixtures: the browser (Debian's Chromium, driven by Playwright, never
downloaded), pages at desktop and phone widths with every script error collected, the
Content-Security-Policy the deployment sets, enforced on every response the browser
gets, and axe-core (installed from the npm registry by ``make test``).

The ledger and people fixtures (``agent``, ``users``) live with their helpers in
test_console_views.py, which the other console test files import.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser import TIMEOUT_MS, launch
from tests.support.fake_http import WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]


def _pinned_axe() -> str:
    """The axe-core version the Makefile pins (AXE_VERSION); `make test` installs it in a
    directory of its own, .venv/axe-<version>."""
    found = re.search(r"^AXE_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile pins no AXE_VERSION"
    return found[1]


AXE = Path(
    os.environ.get(
        "OPENONCE_AXE",
        ROOT / ".venv" / f"axe-{_pinned_axe()}" / "node_modules/axe-core/axe.min.js",
    )
)
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
# What the deployment's settings send (script-src 'self'; style-src 'self'; nothing
# inline); every page is loaded under it so an inline script or style="" shows up as a
# violation the page fixture fails on.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser per module: Playwright's sync API runs an asyncio loop on this thread
    while it is open, and a session-long one would break every later test that calls
    asyncio.run() (pytest-django runs the database tests, these among them, first)."""
    with launch() as browser:
        yield browser


@pytest.fixture
def open_page(chromium: Any, live_server: Any) -> Iterator[Callable[..., Any]]:
    """``open_page(width=..., dark=False, timezone=None)``: a fresh context (cookies,
    storage) and page; at teardown, fails if a page logged a script error or a CSP
    violation."""
    contexts = []
    errors: list[str] = []

    def make(
        viewport: dict[str, int] | None = None, dark: bool = False, timezone: str | None = None
    ) -> Any:
        options: dict[str, Any] = {
            "base_url": live_server.url,
            "viewport": viewport or DESKTOP,
            "color_scheme": "dark" if dark else "light",
        }
        if timezone:
            options["timezone_id"] = timezone
        context = chromium.new_context(**options)
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)

        def with_csp(route: Any) -> None:
            from playwright.sync_api import Error

            try:
                response = route.fetch()
                headers = {**response.headers, "content-security-policy": CSP}
                route.fulfill(response=response, headers=headers)
            except Error:
                pass  # the page went away (navigated, closed) before its request finished

        context.route(f"{live_server.url}/**", with_csp)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
        page.on(
            "console",
            lambda msg: (
                errors.append(f"console: {msg.text}")
                if msg.type == "error" and "Failed to load resource" not in msg.text
                else None
            ),
        )
        return page

    yield make
    for context in contexts:
        context.close()
    assert errors == [], "a page logged script errors or CSP violations"


@pytest.fixture(scope="session")
def axe_source() -> str:
    if not AXE.exists():
        pytest.fail(
            f"axe-core is not installed at {AXE}: run `make test` (it installs it from the npm"
            " registry), or set OPENONCE_AXE to an axe.min.js"
        )
    return AXE.read_text()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    """A local HTTPS-less webhook endpoint that records what it is sent (a test file may
    define its own ``receiver``)."""
    r = WebhookReceiver()
    yield r
    r.close()
