"""Async handlers.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from openonce_core import (
    OpenOnce,
    OutcomeUnknownError,
    current_effect,
)

from .helpers import (
    LoopGatedStore,
    S,
    only_effect,
)


def test_async_handler_runs_once_across_duplicates(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []
    ids: list[str] = []

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    async def send(to: str, subject: str, body: str) -> str:
        calls.append(to)
        ids.append(current_effect().effect_id)
        await asyncio.sleep(0.02)
        return f"msg-{to}"

    async def main() -> list[str]:
        with oo.scope("run-1"):
            together = await asyncio.gather(
                send("a@b.c", "hi", "v1"), send("a@b.c", "hi", "v2"), send("a@b.c", "hi", "v3")
            )
            later = await send("a@b.c", "hi", "reworded")
            return [*together, later]

    assert asyncio.run(main()) == ["msg-a@b.c"] * 4
    assert calls == ["a@b.c"]
    assert ids == [only_effect(store).id]
    assert only_effect(store).state == S.COMMITTED


def test_wrapping_an_async_callable_object_awaits_it_inside_the_effect(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    class SendEmail:
        """An existing tool object whose ``__call__`` is a coroutine function."""

        async def __call__(self, to: str) -> str:
            calls.append(to)
            await asyncio.sleep(0)
            return f"msg-{to}"

    send = oo.effect(SendEmail(), tool="email.send", idempotency_key=lambda to: f"mail-{to}")

    async def main() -> list[str]:
        return [await send("a@b.c"), await send("a@b.c")]

    assert asyncio.run(main()) == ["msg-a@b.c", "msg-a@b.c"]
    assert calls == ["a@b.c"]
    effect = only_effect(store)
    assert effect.state == S.COMMITTED
    assert effect.result == "msg-a@b.c"  # the awaited value, not a coroutine object


def test_async_ledger_writes_do_not_block_the_event_loop(store):
    # Each ledger write holds its thread until the event loop has ticked three more times:
    # on a worker thread it sees them (on a loaded machine too, just later); on the loop's
    # own thread no tick can come, and it gives up after 5 s, noted in ``starved``.
    loop_ticks = [0]
    gated = LoopGatedStore(store, loop_ticks, ticks=3, timeout=5.0)
    oo = OpenOnce(gated, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    async def send(to: str) -> str:
        calls.append(to)
        return "sent"

    async def main() -> int:
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.005)
                loop_ticks[0] += 1

        task = asyncio.create_task(ticker())
        assert await send("a@b.c") == "sent"  # two gated writes
        stop.set()
        await task
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert calls == ["a@b.c"]
    assert len(gated.write_threads) == 2
    assert loop_thread not in gated.write_threads
    assert gated.starved == [], "a ledger write blocked the event loop: it never ticked"


def test_async_ambiguous_error_parks_unknown(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    async def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        await asyncio.sleep(0)
        raise TimeoutError("read timed out")

    async def main() -> None:
        with pytest.raises(OutcomeUnknownError):
            await charge(500)
        with pytest.raises(OutcomeUnknownError):
            await charge(500)

    asyncio.run(main())
    assert calls == [500]
    assert only_effect(store).state == S.UNKNOWN
