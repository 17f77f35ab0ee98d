"""Schema v7: the retention's tombstones are indexed by effect id, so the console finds an
archived effect from a link to ``/effects/<id>/`` without reading every tombstone
(console/views.py answers 410 Gone). A v6 ledger that already holds tombstones upgrades on
both stores, keeps them, and finds them by effect id through the new index."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import psycopg
import pytest

from openonce_core import OpenOnce, SQLiteStore
from openonce_core._schema import SCHEMA_VERSION, migrations
from openonce_core.errors import EffectArchivedError
from openonce_core.stores.postgres import PostgresStore
from tests.core.test_schema_upgrade import install_up_to

INDEX = "openonce_tombstones_effect"


def refunder(oo: OpenOnce, calls: list[str]) -> Callable[[str], str]:
    @oo.effect(tool="stripe.refund", idempotency_key=lambda order: order)
    def refund(order: str) -> str:
        calls.append(order)
        return "re_" + order

    return refund


def _fingerprint() -> str:
    """o-1's arguments fingerprint, as a call writes it (a tombstone keeps it)."""
    scratch = OpenOnce(":memory:")
    try:
        refunder(scratch, [])("o-1")
        return scratch.store.find("stripe.refund", "o-1").args_fingerprint
    finally:
        scratch.close()


# A v6 retention's tombstone of o-1, as the table holds it.
STONE = (
    "stripe.refund", "o-1", "eff_" + "a" * 32, "committed", _fingerprint(), 1.0e9, 1.7e9,
    "/var/lib/openonce/archive/openonce-archive-20260101T000000Z-0123456789abcdef.jsonl.gz",
)  # fmt: skip
BY_ID = "SELECT tool, idempotency_key, state, archive FROM openonce_tombstones WHERE effect_id = "


def test_v7_adds_the_tombstones_effect_index_and_the_oldest_reader_on_both_dialects() -> None:
    for dialect in ("postgres", "sqlite"):
        assert SCHEMA_VERSION == 7
        assert migrations(dialect)[7] == [
            f"CREATE INDEX {INDEX} ON openonce_tombstones (effect_id)",
            "ALTER TABLE openonce_schema ADD COLUMN readable_from integer",
        ], dialect


def test_sqlite_v6_ledger_with_a_tombstone_migrates_and_finds_it_by_effect_id(tmp_path) -> None:
    path = str(tmp_path / "ledger.db")
    conn = sqlite3.connect(path, isolation_level=None)
    install_up_to(conn.execute, "sqlite", 6)
    conn.execute(f"INSERT INTO openonce_tombstones VALUES ({', '.join('?' * 8)})", STONE)
    store = SQLiteStore(path)

    assert store.migrate() == SCHEMA_VERSION == 7

    versions = conn.execute("SELECT version FROM openonce_schema ORDER BY 1").fetchall()
    assert versions == [(v,) for v in range(1, 8)]
    assert conn.execute(BY_ID + "?", (STONE[2],)).fetchall() == [
        ("stripe.refund", "o-1", "committed", STONE[7])
    ]
    plan = str(conn.execute("EXPLAIN QUERY PLAN " + BY_ID + "?", (STONE[2],)).fetchall())
    assert f"USING INDEX {INDEX}" in plan, plan
    conn.close()
    refused_after_upgrade(store)


def test_postgres_v6_ledger_with_a_tombstone_migrates_and_finds_it_by_effect_id(
    pg_dsn: str,
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        install_up_to(conn.execute, "postgres", 6)
        conn.execute(f"INSERT INTO openonce_tombstones VALUES ({', '.join(['%s'] * 8)})", STONE)
    store = PostgresStore(pg_dsn)

    assert store.migrate() == SCHEMA_VERSION == 7

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        indexes = {
            name
            for (name,) in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'openonce_tombstones'"
                " AND schemaname = current_schema()"
            )
        }
        assert indexes == {"openonce_tombstones_pkey", INDEX}
        assert conn.execute(BY_ID + "%s", (STONE[2],)).fetchall() == [
            ("stripe.refund", "o-1", "committed", STONE[7])
        ]
        # A table this small is always read sequentially otherwise.
        with conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            plan = conn.execute("EXPLAIN " + BY_ID + "%s", (STONE[2],)).fetchall()
        assert INDEX in plan[0][0], plan
    refused_after_upgrade(store)


def refused_after_upgrade(store: SQLiteStore | PostgresStore) -> None:
    """The tombstone still does its work: a duplicate of its key is refused."""
    oo = OpenOnce(store, migrate=False)
    calls: list[str] = []
    refund = refunder(oo, calls)
    try:
        with pytest.raises(EffectArchivedError) as info:
            refund("o-1")
        assert info.value.effect_id == STONE[2] and calls == []
    finally:
        oo.close()
