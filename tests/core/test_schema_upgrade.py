"""A ledger written by an older schema version keeps every effect and journal line when it
is migrated, and works the same afterwards (version 4 re-keys the Postgres journal)."""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg
import pytest

from openonce_core import OpenOnce, SQLiteStore, runtime
from openonce_core.schema import SCHEMA_TABLE, SCHEMA_VERSION, migrations
from openonce_core.stores.postgres import PostgresStore

JOURNAL = "SELECT seq, effect_id, from_state, to_state, actor, action FROM openonce_journal"


def install_up_to(execute: Any, dialect: str, version: int) -> None:
    """The schema as a ledger of ``version`` has it, as its own migrate left it."""
    execute(SCHEMA_TABLE[dialect])
    for v, statements in sorted(migrations(dialect).items()):
        if v <= version:
            for stmt in statements:
                execute(stmt)
            execute(f"INSERT INTO openonce_schema VALUES ({v}, 0)")


def as_version_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let this code write to a version 3 ledger, as version 3's code did: v4 changed no
    column, only how the journal is keyed."""
    monkeypatch.setattr(runtime, "_check_schema", lambda store: None)


def write_some(oo: OpenOnce) -> tuple[Any, list[str]]:
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        return f"sent to {to}"

    for to in ("a@example.com", "b@example.com", "c@example.com"):
        send(to)
    return send, calls


def test_postgres_v3_ledger_migrates_to_the_journal_keyed_by_effect(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install_up_to(conn.execute, "postgres", 3)
    with monkeypatch.context() as m:
        as_version_3(m)
        oo = OpenOnce(PostgresStore(pg_dsn), migrate=False)
        send, calls = write_some(oo)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        before = conn.execute(JOURNAL + " ORDER BY seq").fetchall()

    assert oo.store.migrate() == SCHEMA_VERSION == 4

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
        assert indexes == {"openonce_journal_pkey", "openonce_journal_operators"}
        # An effect's lines, in order, come from the key (seq scans are ruled out because
        # a table this small is always read sequentially otherwise).
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            plan = conn.execute(
                "EXPLAIN SELECT * FROM openonce_journal WHERE effect_id = %s ORDER BY seq",
                (before[0][1],),
            ).fetchall()
        assert "openonce_journal_pkey" in plan[0][0]
        # The journal is still append-only.
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            conn.execute("DELETE FROM openonce_journal")

    # The upgraded ledger replays what it recorded and writes new effects as before.
    assert send("a@example.com") == "sent to a@example.com"
    assert send("d@example.com") == "sent to d@example.com"
    assert calls == ["a@example.com", "b@example.com", "c@example.com", "d@example.com"]
    lines = oo.store.journal(oo.store.find("send", "mail-d@example.com").id)
    assert [(j.from_state, j.to_state) for j in lines] == [
        ("planned", "started"),
        ("started", "committed"),
    ]
    oo.close()


def test_sqlite_v3_ledger_migrates_unchanged(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "ledger.db")
    conn = sqlite3.connect(path, isolation_level=None)
    install_up_to(conn.execute, "sqlite", 3)
    with monkeypatch.context() as m:
        as_version_3(m)
        oo = OpenOnce(SQLiteStore(path), migrate=False)
        send, calls = write_some(oo)
    before = conn.execute(JOURNAL + " ORDER BY seq").fetchall()

    assert oo.store.migrate() == SCHEMA_VERSION

    assert conn.execute(JOURNAL + " ORDER BY seq").fetchall() == before
    versions = conn.execute("SELECT version FROM openonce_schema ORDER BY 1").fetchall()
    assert versions == [(1,), (2,), (3,), (4,)]
    plan = conn.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM openonce_journal WHERE effect_id = ? ORDER BY seq",
        (before[0][1],),
    ).fetchall()
    assert "openonce_journal_effect" in str(plan)
    assert send("b@example.com") == "sent to b@example.com"
    assert calls == ["a@example.com", "b@example.com", "c@example.com"]
    conn.close()
    oo.close()
