"""What the behavioural suite's sections share: names, exceptions and helpers.

Every test takes the ``store`` fixture (in-memory, SQLite, Postgres) and builds
``OpenOnce(store, retry_delay=0, ...)``. Handlers append to a list, so "ran once" is a
count, not a hope; states, journal lines and raised errors are what a user would see.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any

import pytest

from openonce_core import (
    BusinessError,
    EffectState,
    OpenOnce,
    OutcomeUnknownError,
    current_effect,
)

S = EffectState
OWNER = "worker-1"
AGENT = f"agent:{OWNER}"
PEPPER = b"test-pepper-0123456789abcdef"


# -- exceptions named like the ones real HTTP clients raise ------------------------------


class CardDeclined(BusinessError):
    """A business error defined at module level, so a replay can rebuild it."""


class Timeout(OSError):
    """Named like requests.exceptions.Timeout."""


class ReadTimeout(Timeout):
    """Like requests.ReadTimeout: the request may have been sent."""


# -- helpers -----------------------------------------------------------------------------


def moves(oo: OpenOnce, effect_id: str) -> list[tuple[str | None, str]]:
    return [(line.from_state, line.to_state) for line in oo.journal(effect_id)]


def only_effect(store: Any, tool: str | None = None) -> Any:
    effects = [e for e in store.list_effects() if tool is None or e.tool == tool]
    assert len(effects) == 1, effects
    return effects[0]


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
    """Run ``fn`` on its own thread (another caller), its outcome in a future."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(fn, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


class DelegatingStore:
    """A store that forwards everything to ``inner``; subclasses override one method."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CommitFailsStore(DelegatingStore):
    """The finishing write (state -> committed/failed) raises, like a ledger that went away
    between the handler's return and the second commit."""

    def __init__(self, inner: Any, failing_states: tuple[str, ...] = (S.COMMITTED,)) -> None:
        super().__init__(inner)
        self.failing_states = failing_states

    def update(self, effect_id, expect_states, expect_fence, changes, entry, approval=None):
        if changes.get("state") in self.failing_states:
            raise RuntimeError("ledger unreachable: disk full")
        return self.inner.update(effect_id, expect_states, expect_fence, changes, entry, approval)


class LoopGatedStore(DelegatingStore):
    """Every write blocks its thread until the event loop has ticked ``ticks`` more times
    (``loop_ticks[0]`` counts them), and records which thread it was.

    A write run on a worker thread sees the loop tick while it waits, however slow the
    machine; one run on the loop's own thread blocks the loop, sees no tick, and gives up
    after ``timeout`` seconds, noted in ``starved``."""

    def __init__(self, inner: Any, loop_ticks: list[int], ticks: int = 3, timeout: float = 5.0):
        super().__init__(inner)
        self.loop_ticks = loop_ticks
        self.ticks = ticks
        self.timeout = timeout
        self.write_threads: list[int] = []
        self.starved: list[int] = []

    def _gate(self) -> None:
        self.write_threads.append(threading.get_ident())
        until = self.loop_ticks[0] + self.ticks
        deadline = time.monotonic() + self.timeout
        while self.loop_ticks[0] < until:
            if time.monotonic() > deadline:
                self.starved.append(threading.get_ident())
                return
            time.sleep(0.001)

    def insert_or_find(self, effect, entries):
        self._gate()
        return self.inner.insert_or_find(effect, entries)

    def update(self, *args, **kwargs):
        self._gate()
        return self.inner.update(*args, **kwargs)


def wait_until(check: Any, what: str, timeout: float = 30.0) -> None:
    """Wait (real time, bounded) for another thread to get somewhere."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


def raw_ledger_text(store: Any, store_kind: str) -> str:
    """Everything a durable store has written, as text (for secret-leak checks)."""
    if store_kind == "sqlite":
        data = b""
        for suffix in ("", "-wal", "-shm", "-journal"):
            path = store.path + suffix
            if os.path.exists(path):
                with open(path, "rb") as f:
                    data += f.read()
        return data.decode("latin-1")
    assert store_kind == "postgres"
    import psycopg

    parts = []
    with psycopg.connect(store.dsn) as conn:
        for table in ("openonce_effects", "openonce_journal", "openonce_approvals"):
            rows = conn.execute(f"SELECT t::text FROM {table} t").fetchall()
            parts.extend(r[0] for r in rows)
    return "\n".join(parts)


# -- tools several sections declare ----------------------------------------------------


def refund_tool(oo: OpenOnce, **options: Any):
    calls: list[tuple[str, int]] = []
    options.setdefault("idempotency_key", lambda charge, **_: f"refund-{charge}")

    @oo.effect(tool="stripe.refund", **options)
    def refund(charge: str, amount_cents: int) -> dict[str, Any]:
        calls.append((charge, amount_cents))
        return {"refund": "re_1", "amount_cents": amount_cents}

    return refund, calls


def ambiguous_charge(oo: OpenOnce):
    calls: list[int] = []
    outcomes: list[Any] = [TimeoutError("read timed out")]

    @oo.effect(tool="stripe.charge", idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> dict[str, Any]:
        calls.append(current_effect().attempt)
        outcome = outcomes.pop(0) if outcomes else {"id": f"pi_{len(calls)}"}
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return charge, calls


def park_unknown(oo: OpenOnce, charge: Any) -> str:
    with pytest.raises(OutcomeUnknownError) as info:
        charge(500)
    assert oo.get(info.value.effect_id).state == S.UNKNOWN
    return info.value.effect_id
