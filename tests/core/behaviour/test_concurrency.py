"""Concurrency.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any

from openonce_core import (
    OpenOnce,
)

from .helpers import (
    S,
    only_effect,
)


def test_concurrent_duplicates_run_the_handler_once(store):
    oo = OpenOnce(store, retry_delay=0, wait_seconds=10)
    calls: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        with lock:
            calls.append(to)
        time.sleep(0.05)
        return {"message_id": "m-1"}

    def caller() -> Any:
        barrier.wait(5)
        return send("a@b.c")

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = [f.result(timeout=20) for f in [pool.submit(caller) for _ in range(8)]]
    assert results == [{"message_id": "m-1"}] * 8
    assert calls == ["a@b.c"]
    assert only_effect(store).state == S.COMMITTED
