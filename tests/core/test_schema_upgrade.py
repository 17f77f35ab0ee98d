"""A ledger written by an older schema version keeps every effect and journal line when it
is migrated, and works the same afterwards (version 4 re-keys the Postgres journal; version
5 adds ``next_probe_at`` and the indexes of what is due, openonce_core/_due.py).

The old ledgers hold rows exactly as calls write them: made by this code on a scratch
ledger, then copied column for column (all but the ones a later version added)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from openonce_core import OpenOnce, SQLiteStore, Store
from openonce_core._reconcile import Reconciler
from openonce_core._schema import SCHEMA_TABLE, SCHEMA_VERSION, migrations, version_row
from openonce_core.stores.postgres import PostgresStore
from openonce_core.stores.sql import COLUMNS, JOURNAL_COLUMNS

JOURNAL = "SELECT seq, effect_id, from_state, to_state, actor, action FROM openonce_journal"
V4_COLUMNS = ", ".join(c for c in COLUMNS if c != "next_probe_at")
EFFECTS = f"SELECT {V4_COLUMNS} FROM openonce_effects ORDER BY id"
MAILS = ("a@example.com", "b@example.com", "c@example.com")


def install_up_to(execute: Any, dialect: str, version: int) -> None:
    """The schema as a ledger of ``version`` has it, as its own migrate left it."""
    execute(SCHEMA_TABLE[dialect])
    for v, statements in sorted(migrations(dialect).items()):
        if v <= version:
            for stmt in statements:
                execute(stmt)
            execute(version_row(v, 0))


def sender(oo: OpenOnce, calls: list[str]) -> Callable[[str], Any]:
    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        if to.startswith("lost"):
            raise TimeoutError("the mail server went quiet after the DATA command")
        return f"sent to {to}"

    return send


def copy_old_rows(execute: Callable[[str, Any], Any], mark: str) -> None:
    """Three mails sent and one UNKNOWN, as a ledger of version 3 or 4 holds them."""
    scratch = OpenOnce(":memory:")
    send = sender(scratch, [])
    for to in MAILS:
        send(to)
    with pytest.raises(Exception, match="quiet"):
        send("lost@example.com")
    store: Any = scratch.store
    effects = store._all(EFFECTS, ())
    lines = store._all(f"SELECT {JOURNAL_COLUMNS} FROM openonce_journal ORDER BY seq", ())
    scratch.close()
    for row in effects:
        marks = ", ".join([mark] * len(row))
        execute(f"INSERT INTO openonce_effects ({V4_COLUMNS}) VALUES ({marks})", row)
    for line in lines:
        marks = ", ".join([mark] * len(line))
        execute(f"INSERT INTO openonce_journal ({JOURNAL_COLUMNS}) VALUES ({marks})", line)


def works_after_upgrade(store: Store) -> None:
    """The upgraded ledger replays what it recorded, writes new effects as before, and its
    UNKNOWN effect (never asked again: no next probe) is due after its grace."""
    oo = OpenOnce(store, migrate=False)
    calls: list[str] = []
    send = sender(oo, calls)
    assert send("a@example.com") == "sent to a@example.com"
    assert send("d@example.com") == "sent to d@example.com"
    assert calls == ["d@example.com"]
    lines = oo.store.journal(oo.store.find("send", "mail-d@example.com").id)
    assert [(j.from_state, j.to_state) for j in lines] == [
        ("planned", "started"),
        ("started", "committed"),
    ]
    lost = oo.store.find("send", "mail-lost@example.com")
    assert lost.state == "unknown" and lost.next_probe_at is None
    rec = Reconciler(oo, grace_seconds=0)
    try:
        assert [e.id for e in rec.due()] == [lost.id]
    finally:
        rec.close()
        oo.close()


def test_postgres_v3_ledger_migrates_to_the_journal_keyed_by_effect(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install_up_to(conn.execute, "postgres", 3)
        copy_old_rows(conn.execute, "%s")
        before = conn.execute(JOURNAL + " ORDER BY seq").fetchall()
    store = PostgresStore(pg_dsn)

    assert store.migrate() == SCHEMA_VERSION == 7

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == before
        key = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'openonce_journal_pkey'"
        ).fetchone()
        assert key == ("PRIMARY KEY (effect_id, seq)",)
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'openonce_journal'"
            )
        }
        assert indexes == {
            "openonce_journal_pkey",
            "openonce_journal_operators",
            "openonce_journal_seq",  # v5: the notifier's cursor
        }
        # An effect's lines, in order, come from the key (seq scans are ruled out because
        # a table this small is always read sequentially otherwise).
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            plan = conn.execute(
                "EXPLAIN SELECT * FROM openonce_journal WHERE effect_id = %s ORDER BY seq",
                (before[0][1],),
            ).fetchall()
        assert "openonce_journal_pkey" in plan[0][0]
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("DELETE FROM openonce_journal")

    works_after_upgrade(store)


def test_postgres_v4_ledger_migrates_to_the_current_schema_keeping_every_row(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install_up_to(conn.execute, "postgres", 4)
        copy_old_rows(conn.execute, "%s")
        effects = conn.execute(EFFECTS).fetchall()
        journal = conn.execute(JOURNAL + " ORDER BY seq").fetchall()
    store = PostgresStore(pg_dsn)

    assert store.migrate() == SCHEMA_VERSION == 7

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute(EFFECTS).fetchall() == effects
        assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == journal
        assert conn.execute(
            "SELECT count(*) FROM openonce_effects WHERE next_probe_at IS NOT NULL"
        ).fetchone() == (0,)
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'openonce_effects'"
            )
        }
        assert {"openonce_effects_unknown_fresh", "openonce_effects_unknown_next"} <= indexes
        # Still append-only: only a transaction that says it is the retention may delete.
        for change in ("UPDATE openonce_journal SET reason = 'x'", "DELETE FROM openonce_journal"):
            with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
                conn.execute(change)
        assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == journal

    works_after_upgrade(store)


@pytest.mark.parametrize("version", [3, 4])
def test_sqlite_old_ledger_migrates_to_the_current_schema_keeping_every_row(
    tmp_path, version: int
) -> None:
    path = str(tmp_path / "ledger.db")
    conn = sqlite3.connect(path, isolation_level=None)
    install_up_to(conn.execute, "sqlite", version)
    copy_old_rows(conn.execute, "?")
    effects = conn.execute(EFFECTS).fetchall()
    journal = conn.execute(JOURNAL + " ORDER BY seq").fetchall()
    store = SQLiteStore(path)

    assert store.migrate() == SCHEMA_VERSION == 7

    assert conn.execute(EFFECTS).fetchall() == effects
    assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == journal
    versions = conn.execute("SELECT version FROM openonce_schema ORDER BY 1").fetchall()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM openonce_journal WHERE effect_id = ? ORDER BY seq",
        (journal[0][1],),
    ).fetchall()
    assert "openonce_journal_effect" in str(plan)
    for change in ("UPDATE openonce_journal SET reason = 'x'", "DELETE FROM openonce_journal"):
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(change)
    assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == journal
    conn.close()

    works_after_upgrade(store)
