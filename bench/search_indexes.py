"""What each of the console's search indexes (schema v3) costs the agent's hot path.

The hot path's write is bench/hotpath.py's raw new effect: an ``INSERT ... ON CONFLICT
DO NOTHING`` of a row shaped like the core's and one ``UPDATE`` of it to committed, each
its own durable commit. Here it runs against copies of ``openonce_effects`` that differ
only in their indexes, in one Postgres schema, interleaved in chunks of CHUNK calls (the
order shuffled for every chunk), so the machine's noise falls on every variant alike:

* ``v1`` — the indexes before the search (schema version 1);
* ``v1 + id prefix`` — plus ``(id text_pattern_ops)``;
* ``v1 + arguments GIN`` — plus the ``jsonb_path_ops`` GIN on ``args_json::jsonb``;
* ``v3`` — every v3 statement (the key and scope indexes replaced in place, so they
  add nothing; the two above are the only new ones).

Per round, each variant's calls/s and its ratio to ``v1`` in that round; the report gives
the median ratio over the rounds (and each round's, to show the spread).

``--each`` measures every index the hot path writes instead, one at a time, on both stores
(``--store``): the write is bench/hotpath.py's *floor* (a full effect row and its journal
line in one commit, the update and its line in the next) on copies of the ledger's two
tables with every index of the current schema, against the same copies without that one
index (leave one out), interleaved as above. An index's cost is what the call loses
without it; the primary keys and the unique key are not left out (every write needs them).
Usage::

    python bench/search_indexes.py [--calls N] [--rounds R] [--pg-dsn DSN] [--async-commit]
    python bench/search_indexes.py --each [--store sqlite|postgres|both] [--async-commit]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import uuid
from contextlib import contextmanager
from typing import Any

from hotpath import (
    _RAW_INSERT,
    _RAW_UPDATE,
    _pg,
    floor_new_pg,
    floor_new_sqlite,
    raw_new,
    raw_table_ddl,
    say,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from openonce_core._schema import _V1, _V3_SEARCH_PG, migrations

DEFAULT_PG = "postgresql://root@127.0.0.1:5432/test"
CHUNK = 50


def _effects_ddl(statements: list[str], table: str) -> list[str]:
    """The statements of ``statements`` that shape openonce_effects, renamed to ``table``."""
    found = []
    for stmt in statements:
        text = " ".join(stmt.split())
        if (
            text.startswith("CREATE TABLE openonce_effects ")
            or text.startswith("DROP INDEX IF EXISTS openonce_effects_")
            or " ON openonce_effects " in text
        ):
            found.append(text.replace("openonce_effects", table))
    return found


def variants() -> dict[str, list[str]]:
    v1 = list(_V1)
    by_name = {" ".join(s.split()).split(" ON ")[0].split()[-1]: s for s in _V3_SEARCH_PG}
    return {
        "v1": v1,
        "v1 + id prefix": [*v1, by_name["openonce_effects_id_prefix"]],
        "v1 + arguments GIN": [*v1, by_name["openonce_effects_args"]],
        "v3": [*v1, *_V3_SEARCH_PG],
    }


@contextmanager
def scratch_schema(dsn: str) -> Any:
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = "bench_idx_" + uuid.uuid4().hex[:10]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield make_conninfo(dsn, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def extra_us(rates: dict[str, list[float]], name: str) -> float:
    """What ``name`` adds to each call over v1, from the median rates."""
    return 1e6 / statistics.median(rates[name]) - 1e6 / statistics.median(rates["v1"])


# Every index the hot path writes, with the query it is there for (ARCHITECTURE.md and
# openonce_core/_schema.py say more). Partial indexes whose condition a new effect never
# meets (UNKNOWN only, operators' lines only) are listed too: they cost a check, no entry.
SERVES = {
    "openonce_effects_pkey": "every move: UPDATE ... WHERE id = ?; get(), the detail page",
    "openonce_effects_key_uniq": "first writer wins: ON CONFLICT (tool, idempotency_key);"
    " every replay's read (find_replay)",
    "openonce_effects_state_updated": "the human queue and state filters; the lease sweep"
    " (state = 'started' by updated_at)",
    "openonce_effects_created": "the console's list by time (keyset pagination), the retention",
    "openonce_effects_scope": "the console's search by run id (scope), exact or prefix",
    "openonce_effects_tool": "the console's filter by tool, newest first",
    "openonce_effects_key": "the console's search by idempotency key, whatever the tool",
    "openonce_effects_id_prefix": "the console's search by effect id prefix (Postgres)",
    "openonce_effects_args": "the console's search by argument value, args_json::jsonb @>"
    " (Postgres GIN)",
    "openonce_effects_unknown_fresh": "the reconciler's due(): UNKNOWN never probed"
    " (partial: a new effect never enters it)",
    "openonce_effects_unknown_next": "the reconciler's due(): UNKNOWN in backoff"
    " (partial: a new effect never enters it)",
    "openonce_journal_pkey": "a journal by effect, in order (store.journal, the detail page)"
    " (Postgres; SQLite: seq is the rowid)",
    "openonce_journal_effect": "a journal by effect, in order (SQLite)",
    "openonce_journal_operators": "the audit log of people's lines (partial: agents' lines"
    " never enter it)",
    "openonce_journal_seq": "the notifier's cursor, seq > ? ORDER BY seq (Postgres; SQLite:"
    " the rowid)",
}
# Not left out: without them a write loses its meaning (first writer wins) or scans.
KEPT = {"openonce_effects_pkey", "openonce_effects_key_uniq"}


def hot_path_indexes(dialect: str) -> list[str]:
    """The indexes of the current schema on the two tables a new effect writes."""
    names: list[str] = []
    for _, batch in sorted(migrations(dialect).items()):
        for text in (" ".join(stmt.split()) for stmt in batch):
            if text.startswith(("CREATE INDEX ", "CREATE UNIQUE INDEX ")):
                name = text.split(" ON ")[0].split()[-1]
                if " ON openonce_effects " in text or " ON openonce_journal " in text:
                    names.append(name)
            elif text.startswith("DROP INDEX IF EXISTS "):
                gone = text.split()[-1]
                names = [n for n in names if n != gone]
    if dialect == "postgres":
        names += ["openonce_journal_pkey"]  # v4's (effect_id, seq) key
    return ["openonce_effects_pkey", *dict.fromkeys(names)]  # the id key: SQLite's autoindex


def _floor_copies(dialect: str, suffix: str) -> list[str]:
    effects, journal = f"bench_fx{suffix}", f"bench_fx_journal{suffix}"
    if dialect == "postgres":
        ddl = [
            f"CREATE TABLE {effects} (LIKE openonce_effects INCLUDING ALL)",
            f"CREATE TABLE {journal} (LIKE openonce_journal INCLUDING ALL)",
        ]
    else:
        ddl = raw_table_ddl("sqlite", "openonce_effects", effects) + raw_table_ddl(
            "sqlite", "openonce_journal", journal
        )
    return ddl


def each_index(dialect: str, conn: Any, args: argparse.Namespace) -> None:
    """Leave-one-out: the floor on copies with every index, and without each one."""
    names = [n for n in hot_path_indexes(dialect) if n not in KEPT]
    tables = {"all": ""}
    for i, name in enumerate(names):
        tables[f"without {name}"] = f"_{i}"
    copies: dict[str, tuple[str, str]] = {}
    for variant, suffix in tables.items():
        for stmt in _floor_copies(dialect, suffix):
            conn.execute(stmt)
        effects, journal = f"bench_fx{suffix}", f"bench_fx_journal{suffix}"
        copies[variant] = (effects, journal)
        if variant != "all":
            dropped = _drop_index(dialect, conn, variant.removeprefix("without "), suffix)
            if not dropped:
                raise SystemExit(f"could not find the copy of {variant} to drop")
    import hotpath

    def run(variant: str, keys: range) -> float:
        effects, journal = copies[variant]
        saved = {
            name: getattr(hotpath, name)
            for name in (
                "_FX_INSERT",
                "_FX_UPDATE_SET",
                "_FX_LINE",
                "_PG_FX_INSERT",
                "_PG_FX_UPDATE",
            )
        }
        try:
            for name, text in saved.items():
                renamed = text.replace("bench_fx_journal", "\0J").replace("bench_fx", effects)
                setattr(hotpath, name, renamed.replace("\0J", journal))
            if dialect == "postgres":
                return floor_new_pg(conn, keys)
            return floor_new_sqlite(conn, keys)
        finally:
            for name, text in saved.items():
                setattr(hotpath, name, text)

    rates: dict[str, list[float]] = {}
    offset = 0
    for variant in tables:  # warm-up: prepared statements, caches
        run(variant, range(offset, offset + 20))
        offset += 20
    for round_no in range(1, args.rounds + 1):
        seconds = dict.fromkeys(tables, 0.0)
        for _ in range(max(1, args.calls // CHUNK)):
            order = list(tables)
            random.shuffle(order)
            for variant in order:
                seconds[variant] += run(variant, range(offset, offset + CHUNK))
                offset += CHUNK
        calls = max(1, args.calls // CHUNK) * CHUNK
        for variant in tables:
            rates.setdefault(variant, []).append(calls / seconds[variant])
        say(f"  {dialect} round {round_no}/{args.rounds} done")
    durable = "asynchronous commits" if args.async_commit else "durable commits"
    base = 1e6 / statistics.median(rates["all"])
    print(
        f"{dialect}: the floor's new effect ({durable}) with every hot-path index:"
        f" {base:.0f} us/call (median of {args.rounds} rounds of {calls} calls);"
        " what each index costs (leave one out):"
    )
    for name in hot_path_indexes(dialect):
        if name in KEPT:
            print(f"  {name:<32} kept  (not left out)   {SERVES.get(name, '')}")
            continue
        without = 1e6 / statistics.median(rates[f"without {name}"])
        print(f"  {name:<32} {base - without:+6.1f} us/call   {SERVES.get(name, '')}")


def _drop_index(dialect: str, conn: Any, name: str, suffix: str) -> bool:
    """Drop the copy of index ``name`` on the tables of ``suffix``; whether one was found."""
    effects, journal = f"bench_fx{suffix}", f"bench_fx_journal{suffix}"
    table = journal if name.startswith("openonce_journal") else effects
    if dialect == "sqlite":
        copy = name.replace("openonce_journal", journal).replace("openonce_effects", effects)
        found = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (copy,)
        ).fetchone()
        if found:
            conn.execute(f"DROP INDEX {copy}")
        return bool(found)
    # LIKE ... INCLUDING ALL names the copies itself: find the one with the same definition.
    (definition,) = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = %s AND schemaname = current_schema()",
        (name,),
    ).fetchone()
    shape = definition.split(" USING ", 1)[1]
    for copy, copy_def in conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s"
        " AND schemaname = current_schema()",
        (table,),
    ).fetchall():
        if copy_def.split(" USING ", 1)[1] == shape:
            if name.endswith("_pkey"):
                conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {copy}")
            else:
                conn.execute(f"DROP INDEX {copy}")
            return True
    return False


def each_main(args: argparse.Namespace) -> int:
    import sqlite3
    import tempfile

    from openonce_core import OpenOnce

    if args.store in ("sqlite", "both"):
        workdir = tempfile.mkdtemp(prefix="openonce-idx-")
        path = os.path.join(workdir, "ledger.db")
        OpenOnce(path).close()  # the ledger's own tables, for the copies' DDL and names
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'OFF' if args.async_commit else 'FULL'}")
            each_index("sqlite", conn, args)
        finally:
            conn.close()
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    if args.store in ("postgres", "both"):
        import psycopg

        from openonce_core.stores.postgres import PostgresStore

        with scratch_schema(args.pg_dsn) as dsn:
            PostgresStore(dsn).migrate()
            with psycopg.connect(dsn, autocommit=True) as conn:
                if args.async_commit:
                    conn.execute("SET synchronous_commit = off")
                each_index("postgres", conn, args)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1500, help="new effects per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg-dsn", default=os.environ.get("OPENONCE_BENCH_PG") or DEFAULT_PG)
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="SET synchronous_commit = off: without the fsync that dominates each commit,"
        " what the indexes themselves cost stands out of the noise",
    )
    parser.add_argument(
        "--each", action="store_true", help="every hot-path index, one at a time (leave one out)"
    )
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    args = parser.parse_args(argv)
    if args.each:
        return each_main(args)

    import psycopg

    ratios: dict[str, list[float]] = {}
    rates: dict[str, list[float]] = {}
    with scratch_schema(args.pg_dsn) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        tables = {}
        for i, (name, statements) in enumerate(variants().items()):
            table = f"bench_v{i}"
            for stmt in _effects_ddl(statements, table):
                conn.execute(stmt)
            tables[name] = table
        if args.async_commit:
            conn.execute("SET synchronous_commit = off")
        sql = {
            name: (
                _pg(_RAW_INSERT).replace("bench_raw", table),
                _pg(_RAW_UPDATE).replace("bench_raw", table),
            )
            for name, table in tables.items()
        }
        offset = 0
        for round_no in range(1, args.rounds + 1):
            seconds = dict.fromkeys(tables, 0.0)
            for _ in range(max(1, args.calls // CHUNK)):
                order = list(tables)
                random.shuffle(order)
                for name in order:
                    keys = range(offset, offset + CHUNK)
                    seconds[name] += raw_new(conn, *sql[name], keys)
                offset += CHUNK
            calls = max(1, args.calls // CHUNK) * CHUNK
            for name in tables:
                rates.setdefault(name, []).append(calls / seconds[name])
                ratios.setdefault(name, []).append(seconds["v1"] / seconds[name])
            say(
                f"  round {round_no}/{args.rounds}: "
                + ", ".join(f"{n} {rates[n][-1]:,.0f}/s" for n in tables)
            )
    commits = "asynchronous commits" if args.async_commit else "durable commits"
    print(f"new effects on Postgres, the raw hot-path write (insert + update, {commits}),")
    print(f"{args.rounds} rounds of {calls} calls per variant, interleaved in chunks of {CHUNK}:")
    for name in tables:
        spread = ", ".join(f"{r:.2f}" for r in ratios[name])
        print(
            f"  {name:<22}median {statistics.median(rates[name]):>7,.0f}/s"
            f"   {statistics.median(ratios[name]):.3f} of v1"
            f"   +{extra_us(rates, name):.0f} us/call   (rounds: {spread})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
