"""bench/ledger_gap.py replays the statements of one real call, as captured and as its
what-ifs rewrite them. A what-if that silently wrote something else would mislead whoever
reads its figures, so each is run here once and its rows are read back."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from openonce_core import OpenOnce, open_store

# Appended, not prepended: bench/ holds console.py and daemon.py, which must never shadow
# the project's packages for the rest of the session.
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))

import ledger_gap
from hotpath import Handler, make_effect


def journal_of(query: Any, key: str) -> tuple[str, list[tuple[str | None, str]]]:
    """The effect holding ``key``: its state and its journal's moves, in order."""
    ((effect_id, state),) = query(
        "SELECT id, state FROM openonce_effects WHERE idempotency_key = ?", (key,)
    )
    lines = query(
        "SELECT from_state, to_state FROM openonce_journal WHERE effect_id = ? ORDER BY seq",
        (effect_id,),
    )
    return state, [tuple(line) for line in lines]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_each_side_writes_what_its_name_says(kind, tmp_path, request):
    if kind == "sqlite":
        target = str(tmp_path / "ledger.db")
        bare: Any = sqlite3.connect(target, isolation_level=None)
        execute = bare.execute
        capture = ledger_gap.capture_sqlite

        def query(stmt: str, params: tuple) -> list:
            return bare.execute(stmt, params).fetchall()
    else:
        target = request.getfixturevalue("pg_dsn")
        bare = psycopg.connect(target, autocommit=True)
        cursor = bare.cursor()

        def execute(stmt: str, params: list) -> Any:
            return cursor.execute(stmt, params).fetchone()

        capture = ledger_gap.capture_postgres

        def query(stmt: str, params: tuple) -> list:
            return bare.execute(stmt.replace("?", "%s"), params).fetchall()

    store = open_store(target)
    store.migrate()
    oo = OpenOnce(store)
    try:
        handler = Handler()
        statements = capture(oo, make_effect(oo, handler), 1)
        assert handler.calls == 1
        state, moves = journal_of(query, "k1")
        assert state == "committed" and len(moves) == 2

        sides = {
            "statements": statements,
            "claim line later": ledger_gap.claim_line_later(kind, statements),
            "no journal lines": ledger_gap.no_journal(kind, statements),
        }
        for n, (side, rewritten) in enumerate(sides.items(), start=10):
            ledger_gap.replayer(execute, rewritten, 1)([n])
            written = journal_of(query, f"s{n}")
            # The same effect row and the same moves as the real call, or none at all.
            assert written == (state, [] if side == "no journal lines" else moves), side
        assert handler.calls == 1  # the replays are statements, not calls
    finally:
        oo.close()
        bare.close()
