"""deploy/Caddyfile buffers requests and responses for gunicorn's sync workers, and Caddy
accepts it. Compose runs caddy:2.11 (``request_buffers``/``response_buffers`` since
2.6.4); Debian bookworm's Caddy is 2.6.2, which knows only the older spelling, so the
file is translated for it (``for_caddy`` in tests/support/caddy.py, which test_stack.py
uses too)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.caddy import CADDY, caddy_version, for_caddy

ROOT = Path(__file__).resolve().parents[2]
CADDYFILE = ROOT / "deploy" / "Caddyfile"


def test_the_proxy_buffers_both_ways() -> None:
    text = CADDYFILE.read_text()
    block = re.search(r"reverse_proxy \{\$OPENONCE_UPSTREAM:web:8000\} \{(.*?)\n\t\}", text, re.S)
    assert block, "reverse_proxy has a block of options"
    assert re.search(r"^\s*request_buffers 4MB$", block[1], re.M)
    assert re.search(r"^\s*response_buffers 4MB$", block[1], re.M)


@pytest.mark.skipif(not CADDY.exists(), reason="Debian's Caddy is absent: apt-get install caddy")
def test_caddy_adapts_the_file_with_buffering_on(tmp_path: Path) -> None:
    version = caddy_version()
    path = tmp_path / "Caddyfile"
    path.write_text(for_caddy(CADDYFILE.read_text(), version))
    done = subprocess.run(
        [str(CADDY), "adapt", "--config", str(path), "--adapter", "caddyfile"],
        capture_output=True, text=True, timeout=60,
        env={"OPENONCE_SITE_ADDRESS": "console.example.com", "OPENONCE_UPSTREAM": "web:8000"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    proxy = _find_handler(json.loads(done.stdout), "reverse_proxy")
    if version >= (2, 6, 4):
        assert proxy["request_buffers"] == proxy["response_buffers"] == 4_000_000
    else:
        assert proxy["buffer_requests"] is proxy["buffer_responses"] is True
        assert proxy["max_buffer_size"] == 4 << 20
    assert proxy["upstreams"] == [{"dial": "web:8000"}]


def _find_handler(node: object, name: str) -> dict:
    if isinstance(node, dict):
        if node.get("handler") == name:
            return node
        children = list(node.values())
    elif isinstance(node, list):
        children = node
    else:
        children = []
    for child in children:
        found = _find_handler(child, name)
        if found:
            return found
    return {}
