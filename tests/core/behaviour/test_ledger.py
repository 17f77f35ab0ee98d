"""The ledger itself.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from openonce_core import (
    ApprovalPending,
    InMemoryStore,
    OpenOnce,
    require_approval_for,
)
from openonce_core._schema import SCHEMA_VERSION

from .helpers import (
    refund_tool,
)


def test_journal_is_append_only(store, store_kind):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, _ = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    oo.approve(effect_id, by="eric", reason="ok")
    journal_before = oo.journal(effect_id)
    approvals_before = oo.approvals(effect_id)
    if store_kind == "sqlite":
        conn = sqlite3.connect(store.path, isolation_level=None)
        for statement in (
            "UPDATE openonce_journal SET reason = 'edited'",
            "DELETE FROM openonce_journal",
            "UPDATE openonce_approvals SET decided_by = 'mallory'",
            "DELETE FROM openonce_approvals",
        ):
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute(statement)
        conn.close()
    elif store_kind == "postgres":
        import psycopg

        for statement in (
            "UPDATE openonce_journal SET reason = 'edited'",
            "DELETE FROM openonce_journal",
            "UPDATE openonce_approvals SET decided_by = 'mallory'",
            "DELETE FROM openonce_approvals",
        ):
            with (
                psycopg.connect(store.dsn, autocommit=True) as conn,
                pytest.raises(psycopg.Error, match="append"),
            ):
                conn.execute(statement)
    else:
        # In memory the same triggers refuse; and what a reader gets back cannot edit it.
        with store._use() as conn:
            for statement in (
                "UPDATE openonce_journal SET reason = 'edited'",
                "DELETE FROM openonce_approvals",
            ):
                with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                    conn.execute(statement)
        lines = oo.journal(effect_id)
        lines.clear()
        with pytest.raises(dataclasses.FrozenInstanceError):
            journal_before[0].reason = "edited"  # type: ignore[misc]
    assert oo.journal(effect_id) == journal_before
    assert oo.approvals(effect_id) == approvals_before
    assert refund("ch_1", 500)["amount_cents"] == 500


def test_schema_version_and_repeated_migrate(store, store_kind):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        return "sent"

    send("a@b.c")
    assert store.schema_version() == SCHEMA_VERSION == 7
    assert store.migrate() == SCHEMA_VERSION
    assert store.migrate() == SCHEMA_VERSION
    assert store.schema_version() == SCHEMA_VERSION
    assert send("a@b.c") == "sent"  # migrating again kept the ledger
    assert calls == ["a@b.c"]
    if store_kind == "sqlite":
        rows = sqlite3.connect(store.path).execute("SELECT version FROM openonce_schema")
        assert rows.fetchall() == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    elif store_kind == "postgres":
        import psycopg

        with psycopg.connect(store.dsn) as conn:
            rows = conn.execute("SELECT version FROM openonce_schema ORDER BY 1").fetchall()
        assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    else:
        assert isinstance(store, InMemoryStore)
