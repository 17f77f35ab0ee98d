"""bench/hotpath.py's floor writes what issue 20 says it writes: on copies of the ledger's
own tables (every index), a full effect row and its claim line in one commit, the update
and its finish line in the next. A floor that wrote less would flatter nobody but make
every ratio against it wrong, so its rows are read back here."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from openonce_core import open_store

# Appended, not prepended: bench/ must never shadow the project's packages.
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import hotpath


def _indexes_sqlite(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
        (table,),
    ).fetchall()
    return sorted(" ".join(r[0].split()).replace(table, "T") for r in rows)


def _indexes_pg(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = %s AND schemaname = current_schema()",
        (table,),
    ).fetchall()
    # LIKE ... INCLUDING ALL names its copies after the new table: compare the definitions.
    return sorted(r[0].split(" USING ", 1)[1] for r in rows)


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_floor_writes_a_full_row_and_a_line_per_commit_on_copies(kind, tmp_path, request):
    if kind == "sqlite":
        target = str(tmp_path / "ledger.db")
        open_store(target).migrate()
        conn: Any = sqlite3.connect(target, isolation_level=None)
        indexes = _indexes_sqlite
        new = hotpath.floor_new_sqlite

        def query(stmt: str) -> list[Any]:
            return conn.execute(stmt).fetchall()
    else:
        target = request.getfixturevalue("pg_dsn")
        store = open_store(target)
        store.migrate()
        store.close()
        conn = psycopg.connect(target, autocommit=True)
        indexes = _indexes_pg
        new = hotpath.floor_new_pg

        def query(stmt: str) -> list[Any]:
            return conn.execute(stmt).fetchall()

    try:
        for stmt in hotpath.floor_table_ddl(kind):
            conn.execute(stmt)
        for table in ("openonce_effects", "openonce_journal"):
            copy = table.replace("openonce_effects", "bench_fx").replace(
                "openonce_journal", "bench_fx_journal"
            )
            assert indexes(conn, copy) == indexes(conn, table)
            assert indexes(conn, copy), f"{copy} has no index: nothing was copied"
        new(conn, range(3))
        rows = query(
            "SELECT idempotency_key, state, fence, lease_owner, result_json, provider_key"
            " FROM bench_fx ORDER BY idempotency_key"
        )
        assert [(k, s, f, o) for k, s, f, o, _, _ in rows] == [
            (f"k{n}", "committed", 2, None) for n in range(3)
        ]
        assert [r[4] for r in rows] == [f'{{"n":{n},"status":"sent"}}' for n in range(3)]
        lines = query(
            "SELECT e.idempotency_key, j.from_state, j.to_state, j.action"
            " FROM bench_fx_journal j JOIN bench_fx e ON e.id = j.effect_id"
            " ORDER BY e.idempotency_key, j.seq"
        )
        assert lines == [
            line
            for n in range(3)
            for line in (
                (f"k{n}", "planned", "started", "claim"),
                (f"k{n}", "started", "committed", "finish"),
            )
        ]
        new(conn, range(1))  # the key is taken: no second row, no line without an effect
        assert query("SELECT count(*) FROM bench_fx")[0][0] == 3
        assert query("SELECT count(*) FROM bench_fx_journal")[0][0] == 6
    finally:
        conn.close()


def test_the_table_says_pass_or_below_against_the_floor_and_gives_the_limits():
    line = hotpath.Line("sqlite", "new effects", "10", hotpath.BUDGET_NEW)
    line.rounds = {"ours": [900.0], "floor": [1000.0], "raw": [1200.0], "minimal": [1100.0]}
    replay = hotpath.Line("sqlite", "replays", "10", hotpath.BUDGET_REPLAY["sqlite"])
    replay.rounds = {"ours": [40.0], "floor": [100.0], "raw": [60.0]}
    text = hotpath.render([line, replay], {"revision": "x", "prepare": None}, rounds=1, notes=[])
    new_row = next(r for r in text.splitlines() if r.startswith("sqlite   new effects"))
    replay_row = next(r for r in text.splitlines() if r.startswith("sqlite   replays"))
    assert new_row.split()[-3:] == ["PASS", "0.750", "0.818"]  # verdict, ours/raw, ours/min
    assert "0.900" in new_row and ">=0.9" in new_row and "PASS" in new_row
    assert "0.400" in replay_row and ">=0.5" in replay_row and "BELOW" in replay_row
    assert replay_row.rstrip().endswith("-")  # a replay has no minimal-journal side
