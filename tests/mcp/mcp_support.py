"""What the gateway's tests share: a config, the upstream's record of calls."""

from __future__ import annotations

import inspect
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

UPSTREAM = Path(__file__).resolve().parent / "mcp_upstream.py"


def config(**overrides: Any) -> dict[str, Any]:
    """The gateway's configuration in the tests: ``pay`` deduped by order, ``refund``
    by an explicit key with the provider key as an argument and behind approval,
    ``decline`` and ``hang`` recorded, ``lookup`` passed through."""
    data: dict[str, Any] = {
        "upstream": {"payments": {"command": "unused-in-process"}},
        "scope": "agent-1",
        "console_url": "https://console.test",
        "tools": {
            "pay": {"tool": "payments.pay", "idempotency_fields": ["order"]},
            "refund": {
                "tool": "payments.refund",
                "idempotency_key": "refund-{charge}",
                "provider_key_argument": "idempotency_key",
            },
            "decline": {"tool": "payments.decline"},
            "convert": {"tool": "payments.convert", "idempotency_fields": ["order", "rate"]},
            "hang": {"tool": "payments.hang", "timeout_seconds": 0.5},
            "crash": {"tool": "payments.crash"},
        },
        "policy": {"require_approval_for": ["payments.refund"]},
    }
    data.update(overrides)
    return data


def received(counts: Path) -> list[dict[str, Any]]:
    """Every call the upstream received, in order."""
    if not counts.exists():
        return []
    return [json.loads(line) for line in counts.read_text().splitlines() if line.strip()]


def tally(counts: Path) -> Counter[str]:
    return Counter(line["tool"] for line in received(counts))


async def until(check: Callable[[], Any], seconds: float) -> None:
    """Return once ``check()`` (or what it returns, when that is awaitable) is truthy;
    fail after ``seconds``. A condition the test waits for, never a fixed time."""
    with anyio.fail_after(seconds):
        while True:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return
            await anyio.sleep(0.01)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
