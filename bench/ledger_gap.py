"""Where a new effect's time goes beyond the raw limit: the database's share, the client's.

For SQLite and Postgres, three sides run interleaved in chunks, in one run:

* ``raw``: bench/hotpath.py's bare raw client, an INSERT and an UPDATE of a bare row, each its own
  durable commit;
* ``statements``: the very statements OpenOnce sends for one new effect (captured from a
  real call), replayed on a bare connection with a fresh id and key each time. What it adds
  to raw is the database's and the driver's share: the journal lines, the CTEs, the larger
  parameter lists, the transaction statements;
* ``ours``: the full call through ``@oo.effect``. What it adds to ``statements`` is the
  client's share: key derivation, checks, building rows, the state table, the lease hold.

And two what-ifs, which OpenOnce does not do: ``claim line later``, the same statements
with the claim's journal line moved from the claim's commit into the finish's (the claim
commit then writes the effect row alone, like raw's INSERT); and ``no journal lines``, the
same statements without their journal lines at all. They show what those changes of the
journal's guarantees would buy, nothing more.

Usage::

    python bench/ledger_gap.py [--sqlite-only] [--pg-dsn DSN] [--rounds N]

The Postgres DSN defaults to ``$OPENONCE_BENCH_PG``; a schema of its own is dropped after.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from hotpath import (
    _RAW_INSERT,
    _RAW_UPDATE,
    Handler,
    Keys,
    _pg,
    floor_new_pg,
    floor_new_sqlite,
    floor_table_ddl,
    make_effect,
    open_pg,
    pg_schema,
    raw_new,
    raw_table_ddl,
    say,
)

from openonce_core import OpenOnce

CHUNK = 200
Statements = list[tuple[str, list[Any]]]


class Recorder:
    """Stands in for a connection during one call and writes down what is executed."""

    def __init__(self, conn: Any, seen: Statements) -> None:
        self._conn, self._seen = conn, seen

    def execute(self, stmt: str, params: Sequence[Any] = ()) -> Any:
        self._seen.append((stmt, list(params)))
        return self._conn.execute(stmt, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def capture_sqlite(oo: OpenOnce, send: Callable[[int], Any], n: int) -> Statements:
    store: Any = oo.store
    seen: Statements = []
    conn = store._conn()
    store._local.conn = Recorder(conn, seen)
    try:
        send(n)
    finally:
        store._local.conn = conn
    return seen


def capture_postgres(oo: OpenOnce, send: Callable[[int], Any], n: int) -> Statements:
    store: Any = oo.store
    seen: Statements = []
    real = store._write

    def recording(stmt: str, params: Any, settle: Any) -> Any:
        seen.append((stmt, list(params)))
        return real(stmt, params, settle)

    store._write = recording
    try:
        send(n)
    finally:
        del store._write  # back to the class's method
    return seen


_PG_JOURNAL_CTE = re.compile(r", j AS \(INSERT INTO openonce_journal .*? AS v\)")
_LINE = "(" + ", ".join(["%s"] * 7) + ")"  # one journal line's placeholders


def claim_line_later(dialect: str, statements: Statements) -> Statements:
    """The what-if: the claim's journal line written by the finish's commit instead."""
    if dialect == "sqlite":
        begin, insert, claim_line, commit, begin2, update, finish_line, commit2 = statements
        return [begin, insert, commit, begin2, update, claim_line, finish_line, commit2]
    (insert, ip), (update, up) = statements
    n_effect = insert.split(" ON CONFLICT", 1)[0].count("%s")  # the row, and the tombstone's key
    claim_params = ip[n_effect : n_effect + 7]
    insert, found = _PG_JOURNAL_CTE.subn("", insert, count=1)
    ip = ip[:n_effect] + ip[n_effect + 7 :]
    lines = f"(VALUES {_LINE}) AS v"
    if not found or lines not in update:
        raise SystemExit("the store's statements changed shape: update claim_line_later")
    n_before = update.split(lines, 1)[0].count("%s")
    update = update.replace(lines, f"(VALUES {_LINE}, {_LINE}) AS v", 1)
    up = up[:n_before] + claim_params + up[n_before:]
    return [(insert, ip), (update, up)]


def no_journal(dialect: str, statements: Statements) -> Statements:
    """The other what-if: the same statements without their journal lines, so the effect
    row alone is written, as raw writes it (the rest of the difference to raw is the
    statements' shape and the transaction statements)."""
    if dialect == "sqlite":
        return [(s, p) for s, p in statements if not s.startswith("INSERT INTO openonce_journal")]
    bare = []
    for stmt, params in statements:
        found = _PG_JOURNAL_CTE.search(stmt)
        if found is None:
            raise SystemExit("the store's statements changed shape: update no_journal")
        before = stmt[: found.start()].count("%s")
        inside = found.group().count("%s")
        bare.append(
            (
                stmt[: found.start()] + stmt[found.end() :],
                params[:before] + params[before + inside :],
            )
        )
    return bare


def replayer(
    execute: Callable[[str, list[Any]], Any], statements: Statements, n: int
) -> Callable[[Sequence[int]], None]:
    """Runs the captured statements once per key, with that call's id and key swapped for
    fresh ones (every other value is the captured call's, which is what the store sent)."""
    effect_id = next(p[0] for _, p in statements if p and str(p[0]).startswith("eff_"))
    key = f"k{n}"

    def run(keys: Sequence[int]) -> None:
        for k in keys:
            swap = {effect_id: "eff_" + uuid.uuid4().hex, key: f"s{k}"}
            for stmt, params in statements:
                execute(stmt, [swap.get(p, p) if type(p) is str else p for p in params])

    return run


def measure(sides: dict[str, Callable[[Sequence[int]], Any]], keys: Keys, rounds: int) -> dict:
    """Microseconds per call for each side: its best round, each round run in chunks that
    alternate between the sides (so a slow patch of the disk lands on all of them)."""
    for run in sides.values():
        run(keys.take(50))  # warm-up: prepared statements, caches
    best = dict.fromkeys(sides, float("inf"))
    names = list(sides)
    for r in range(rounds):
        spent = dict.fromkeys(sides, 0.0)
        for c in range(10):
            for name in names if (r + c) % 2 == 0 else reversed(names):
                block = keys.take(CHUNK)
                start = time.perf_counter()
                sides[name](block)
                spent[name] += time.perf_counter() - start
        for name in names:
            best[name] = min(best[name], 1e6 * spent[name] / (10 * CHUNK))
    return best


# Each side, the side it is compared with, and what the difference is made of.
SHARES = (
    ("raw", "", ""),
    ("floor", "raw", "the same journal lines"),
    ("statements", "floor", "our statements' shape"),
    ("ours", "statements", "client"),
    ("claim line later", "raw", "what-if: database + driver"),
    ("no journal lines", "raw", "what-if: database + driver"),
)


def report(store: str, us: dict[str, float]) -> None:
    raw, floor = us["raw"], us["floor"]
    print(
        f"{store}: per new effect, best of the rounds (us; the floor's rate over this side's,"
        " then bare raw's)"
    )
    print(f"  the 0.9 budget allows {floor / 0.9:.0f} us")
    for side, base, share in SHARES:
        added = f"  {share} +{us[side] - us[base]:.0f}" if base else ""
        print(f"  {side:<17} {us[side]:5.0f}  {floor / us[side]:.3f}  {raw / us[side]:.3f}{added}")


def run_gap(
    store: str,
    oo: OpenOnce,
    capture: Callable[[OpenOnce, Callable[[int], Any], int], Statements],
    execute: Callable[[str, list[Any]], Any],
    raw_side: Callable[[Sequence[int]], Any],
    floor_side: Callable[[Sequence[int]], Any],
    rounds: int,
) -> None:
    handler = Handler()
    send = make_effect(oo, handler)
    keys = Keys()
    first = keys.take(1)[0]
    statements = capture(oo, send, first)
    sides = {
        "raw": raw_side,
        "floor": floor_side,
        "statements": replayer(execute, statements, first),
        "ours": lambda ks: [send(k) for k in ks],
        "claim line later": replayer(execute, claim_line_later(store, statements), first),
        "no journal lines": replayer(execute, no_journal(store, statements), first),
    }
    report(store, measure(sides, keys, rounds))


def gap_sqlite(rounds: int) -> None:
    workdir = tempfile.mkdtemp(prefix="openonce-gap-")
    path = os.path.join(workdir, "ledger.db")
    oo = OpenOnce(path)
    raw = sqlite3.connect(path, isolation_level=None)
    bare = sqlite3.connect(path, isolation_level=None)
    try:
        for conn in (raw, bare):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        for stmt in [*raw_table_ddl("sqlite"), *floor_table_ddl("sqlite")]:
            raw.execute(stmt)
        run_gap(
            "sqlite", oo, capture_sqlite, bare.execute,
            lambda ks: raw_new(raw, _RAW_INSERT, _RAW_UPDATE, ks),
            lambda ks: floor_new_sqlite(raw, ks), rounds,
        )  # fmt: skip
    finally:
        oo.close()
        raw.close()
        bare.close()
        shutil.rmtree(workdir, ignore_errors=True)


def gap_postgres(base_dsn: str, rounds: int) -> None:
    import psycopg

    with pg_schema(base_dsn) as dsn:
        oo = open_pg(dsn, migrate=True)
        raw = psycopg.connect(dsn, autocommit=True)
        bare = psycopg.connect(dsn, autocommit=True)
        try:
            for stmt in [*raw_table_ddl("postgres"), *floor_table_ddl("postgres")]:
                raw.execute(stmt)
            cursor = bare.cursor()
            run_gap(
                "postgres", oo, capture_postgres,
                lambda stmt, params: cursor.execute(stmt, params).fetchone(),
                lambda ks: raw_new(raw, _pg(_RAW_INSERT), _pg(_RAW_UPDATE), ks),
                lambda ks: floor_new_pg(raw, ks), rounds,
            )  # fmt: skip
        finally:
            oo.close()
            raw.close()
            bare.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-only", action="store_true", help="skip Postgres")
    parser.add_argument("--pg-dsn", default=os.environ.get("OPENONCE_BENCH_PG"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    say("sqlite ...")
    gap_sqlite(args.rounds)
    if args.sqlite_only or not args.pg_dsn:
        print("postgres skipped" + ("" if args.sqlite_only else ": set OPENONCE_BENCH_PG"))
        return 0
    say("postgres ...")
    gap_postgres(args.pg_dsn, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
