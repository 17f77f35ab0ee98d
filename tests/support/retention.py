"""What the retention's tests share (tests/core/test_retention*.py, the daily task's).

An ``Agent`` with a counted refund handler, histories of old and young effects, the
archive as an auditor reads it, and the ledger's rows as the database holds them.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from openonce_core import (
    ApprovalPending,
    BusinessError,
    OpenOnce,
    UnknownOutcomeError,
    open_store,
    require_approval_for,
)
from openonce_core._retention import RetentionPolicy, RetentionReport, run_retention
from openonce_core.testing import FakeClock

DAY = 86400.0
POLICY = RetentionPolicy(older_than=90 * DAY, batch_size=2)
TABLES = ("openonce_effects", "openonce_journal", "openonce_approvals")


class Agent:
    """One OpenOnce client with a counted handler per tool; ``clock`` is the ledger's."""

    def __init__(self, store: Any, clock: FakeClock, **options: Any) -> None:
        self.oo = OpenOnce(store, retry_delay=0, clock=clock, **options)
        self.clock = clock
        self.calls: list[tuple[str, str]] = []
        self.young = 0

        @self.oo.effect(tool="stripe.refund", idempotency_key=lambda order, outcome="ok": order)
        def refund(order: str, outcome: str = "ok") -> dict[str, str]:
            self.calls.append(("refund", order))
            if outcome == "declined":
                raise BusinessError("card declined")
            if outcome == "lost":
                raise UnknownOutcomeError("the reply was lost")
            return {"refund": "re_" + order}

        self.refund = refund

    def effect_of(self, order: str) -> Any:
        return self.oo.store.find("stripe.refund", self._key(order))

    def _key(self, order: str) -> str:
        # The key is derived from the order alone (the lambda above), as the library does.
        ids = [e for e in self.oo.store.list_effects(limit=1000) if e.args.get("order") == order]
        return ids[-1].idempotency_key


LEDGER_TABLES = (
    "openonce_effects",
    "openonce_journal",
    "openonce_approvals",
    "openonce_tombstones",
)


def empty_ledger(target: str) -> None:
    """Every effect, line, approval and tombstone of the ledger at ``target`` deleted (the
    Django test database's, between tests). SQLite's journal refuses deletes outside the
    retention's own transaction, so they go through it there."""
    store: Any = open_store(target)
    try:
        if store.dialect == "postgres":
            with psycopg.connect(target, autocommit=True) as conn:
                conn.execute(f"TRUNCATE {', '.join(LEDGER_TABLES)}")
        else:
            store.retention_write(lambda cur: [cur.run(f"DELETE FROM {t}") for t in LEDGER_TABLES])
    finally:
        store.close()


def age(agent: Agent) -> None:
    """91 days pass, then one young effect is recorded: on SQLite the effect holding the
    newest journal line is never archived (its seq would be handed out again)."""
    agent.clock.advance(91 * DAY)
    agent.young += 1
    agent.refund(f"young-{agent.young}")


def approved_history(store: Any) -> Agent:
    """Committed, failed and approved-then-committed refunds, all old, then a young one."""
    clock = FakeClock()
    agent = Agent(store, clock, policy=require_approval_for(["stripe.*"]))
    for order in ("o-1", "o-2", "o-3", "young-1"):
        if order == "young-1":
            clock.advance(91 * DAY)  # on SQLite the newest line's effect always stays
        with pytest.raises(ApprovalPending) as info:
            agent.refund(order)
        agent.oo.approve(info.value.effect_id, by="maria")
        agent.refund(order)
    return agent


def run(store: Any, clock: FakeClock, folder: Any, **kw: Any) -> RetentionReport:
    """The retention at the ledger clock's time (POLICY unless ``policy=``)."""
    return run_retention(store, kw.pop("policy", POLICY), str(folder), now=clock.now(), **kw)


def archive_lines(path: str) -> list[dict[str, Any]]:
    """An archive as an auditor reads it: gzip, then one JSON object per line."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def raw_connection(store: Any) -> Any:
    """A connection of the store's own kind, outside the store."""
    if store.dialect == "postgres":
        return psycopg.connect(store.dsn, autocommit=True)
    return sqlite3.connect(store.path, isolation_level=None)


def dump(store: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the ledger's tables, as the database holds them."""
    order = {"openonce_effects": "id", "openonce_journal": "seq", "openonce_approvals": "id"}
    return {t: [tuple(r) for r in store._all(f"SELECT * FROM {t} ORDER BY {order[t]}", ())]
            for t in TABLES}  # fmt: skip


def stones(store: Any) -> list[tuple[Any, ...]]:
    """Every key tombstone, as the database holds it."""
    return [tuple(r) for r in store._all("SELECT * FROM openonce_tombstones ORDER BY 1, 2", ())]


@dataclass
class Refunds:
    """A client of a ledger named by its DSN or path, and what its handler ran."""

    oo: OpenOnce
    refund: Any
    calls: list[str] = field(default_factory=list)

    def ids(self) -> dict[str, str]:
        return {e.args["order"]: e.id for e in self.oo.store.list_effects()}


def old_and_new_refunds(target: str, **options: Any) -> Refunds:
    """o-1 and o-2 ended 100 days ago on this host's clock (the command and the daily
    task read the ledger's own clock), o-new just now."""
    clock = FakeClock(start=time.time() - 100 * DAY)
    oo = OpenOnce(target, retry_delay=0, clock=clock, **options)
    made = Refunds(oo, None)

    @oo.effect(tool="stripe.refund", idempotency_key=lambda order: order)
    def refund(order: str) -> str:
        made.calls.append(order)
        return "re_" + order

    made.refund = refund
    refund("o-1")
    refund("o-2")
    clock.set(time.time())
    refund("o-new")
    return made


@contextlib.contextmanager
def statement_held(holder: Any, waiter: Any, lock: int) -> Iterator[None]:
    """Inside the block, ``waiter`` (a Postgres connection) is running a statement: it
    waits for advisory lock ``lock``, which ``holder`` (a connection to the same database:
    advisory locks are per database) takes first and releases at the block's end."""
    holder.execute("SELECT pg_advisory_lock(%s)", (lock,))
    blocked = threading.Thread(
        target=lambda: waiter.execute("SELECT pg_advisory_lock(%s)", (lock,)), daemon=True
    )
    blocked.start()
    try:
        while not holder.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]:
            pass
        yield
    finally:
        holder.execute("SELECT pg_advisory_unlock(%s)", (lock,))
        blocked.join(10)
