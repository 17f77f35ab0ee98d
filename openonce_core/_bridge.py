"""Async handlers: the ledger's blocking I/O runs on a worker thread, the handler itself runs
on the caller's event loop, so the loop is never blocked by the ledger."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any


class HandlerNotStarted(Exception):
    """The handler's coroutine never began (its event loop closed, or the task was
    cancelled before its first step): nothing was sent, so the claim is given back."""


def run_on_loop(
    loop: asyncio.AbstractEventLoop,
    make_coro: Callable[[], Any],
    context: contextvars.Context,
) -> Any:
    """Run a coroutine on ``loop`` from a worker thread and block this thread for it."""
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()
    started = False

    async def run() -> Any:
        nonlocal started
        started = True
        return await make_coro()

    def start() -> None:
        try:
            task = loop.create_task(run(), context=context)
        except BaseException as exc:
            done.set_exception(HandlerNotStarted(f"the handler could not be scheduled: {exc!r}"))
            return

        def finished(t: asyncio.Task[Any]) -> None:
            if t.cancelled():
                done.set_exception(
                    asyncio.CancelledError() if started else HandlerNotStarted("cancelled")
                )
            elif t.exception() is not None:
                done.set_exception(t.exception())  # type: ignore[arg-type]
            else:
                done.set_result(t.result())

        task.add_done_callback(finished)

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError as exc:  # the loop is closed
        raise HandlerNotStarted(f"the event loop is gone: {exc}") from None
    # Not done.result(timeout=...): its TimeoutError is the very class a handler's read
    # timeout raises, and the two must not be confused.
    while not concurrent.futures.wait([done], timeout=1.0).done:
        if loop.is_closed():
            # The loop closed under us: before the handler began, nothing was sent;
            # after, it was abandoned mid-call and may have happened.
            if not started:
                raise HandlerNotStarted("the event loop closed first") from None
            raise asyncio.CancelledError() from None
    return done.result()
