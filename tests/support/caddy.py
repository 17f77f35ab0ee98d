"""Debian's Caddy (bookworm: 2.6.2) beside the Caddy compose runs (2.11): the same
Caddyfile, translated where the two spell a directive differently."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CADDY = Path("/usr/bin/caddy")


def caddy_version() -> tuple[int, int, int]:
    out = subprocess.run([str(CADDY), "version"], capture_output=True, text=True).stdout
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    assert match, out
    return int(match[1]), int(match[2]), int(match[3])


def for_caddy(text: str, version: tuple[int, int, int]) -> str:
    """The Caddyfile as a Caddy older than 2.6.4 reads it: buffer_requests /
    buffer_responses with one max_buffer_size, for the same sizes."""
    if version >= (2, 6, 4):
        return text
    size = re.search(r"request_buffers (\S+)", text)
    assert size, "the Caddyfile buffers requests"
    text = re.sub(r"request_buffers \S+", "buffer_requests", text)
    text = re.sub(r"response_buffers \S+", "buffer_responses", text)
    megabytes = int(size[1].removesuffix("MB"))
    return text.replace(
        "buffer_responses", f"buffer_responses\n\t\tmax_buffer_size {megabytes << 20}"
    )
