"""The demo's console as a visitor meets it: the product's own 404 page (no URLconf, no
traceback), styled pages with static files served by WhiteNoise under runserver, and the
same security headers as production. The server is started exactly as ``make demo``
starts it (examples.demo's environment and command line)."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples import demo

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module's tests: they only read pages, and starting one takes
    most of a second."""
    tmp_path = tmp_path_factory.mktemp("demo")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(demo, "LEDGER", tmp_path / "demo.db")
        monkeypatch.setattr(demo, "WORLD", tmp_path / "demo-world.json")
        port = _free_port()
        log = tmp_path / "runserver.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(
                demo.server_argv(port), cwd=ROOT, env=demo.demo_env(), stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, log.read_text()
                try:
                    _get(f"{base}/login/")
                    break
                except OSError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.05)  # the server is starting
            yield base
        finally:
            server.terminate()
            server.wait(10)


def test_the_demo_shows_the_products_own_error_pages(demo_server: str) -> None:
    status, _, body = _get(f"{demo_server}/no-such-page/")
    assert status == 404
    assert "Not found" in body and "OpenOnce console" in body
    for debug in ("URLconf", "Traceback", "DEBUG = True", "openonce_site.urls"):
        assert debug not in body


def test_the_demo_console_is_styled_and_hardened(demo_server: str) -> None:
    status, headers, body = _get(f"{demo_server}/login/")
    assert status == 200 and 'href="/static/console/console.css"' in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "camera=()" in headers["Permissions-Policy"]
    status, headers, css = _get(f"{demo_server}/static/console/console.css")
    assert status == 200 and headers["Content-Type"].startswith("text/css")
    assert "--accent" in css
    status, headers, _ = _get(f"{demo_server}/static/console/htmx.min.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
