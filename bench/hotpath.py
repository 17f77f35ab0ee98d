"""The ledger's hot path against its floor, and against the raw limits, in one run.

For SQLite and Postgres on this machine, side by side (issue 20, "the hot-path decision"):

* new effects/s through OpenOnce (fresh explicit key per call) vs the *floor*: on a bare
  persistent connection, copies of the ledger's own tables with the same indexes
  (``bench_fx``, ``bench_fx_journal``), a full effect row and one journal row in the first
  durable commit, the update and one journal row in the second;
* replays/s (the same keys again; the handler must not run) vs the same table's single-row
  read by the unique key;
* on Postgres, four processes doing new effects together vs four floor clients.

Two limit figures are reported beside the floor: *bare raw* (``bench_raw``: an ``INSERT ...
ON CONFLICT DO NOTHING`` of a compact row and one ``UPDATE``, each its own commit, no
journal) and *minimal raw + journal* (bare raw, plus a minimal journal line, effect id and
state, in a table with only its key, in each of the two commits).

Durability is the store's: SQLite in WAL with ``synchronous=FULL``, Postgres with the
server's ``synchronous_commit`` (on by default). Each round runs every side in chunks,
interleaved, rotating which goes first; a side's result is its best round. Usage::

    python bench/hotpath.py [--sqlite-only] [--pg-dsn DSN] [--json] [--rounds N] [--no-prepare]

By default the store decides (``PostgresStore(prepare=None)``: server-side prepared
statements on a direct TCP connection, as here); ``--no-prepare`` measures it as behind
pgbouncer, preparing nothing. The floor and raw clients keep psycopg's default (they
prepare a statement on its fifth run).

The Postgres DSN defaults to ``$OPENONCE_BENCH_PG`` (``make bench`` sets it); the script
creates a schema of its own there and drops it at the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from openonce_core import OpenOnce
from openonce_core._schema import migrations
from openonce_core.stores.sql import JOURNAL_COLUMNS, NEW_COLUMNS, SELECT_COLUMNS

TOOL = "bench_send"
WARMUP = 50  # calls per side before timing: connections, prepared statements, caches
CHUNKS = 10  # the sides alternate this many times within a round

# The hot-path budgets (issue 20): ours / floor must reach at least this.
BUDGET_NEW = 0.9
BUDGET_REPLAY = {"sqlite": 0.5, "postgres": 0.8}
BUDGET_GROUP = 0.8

SIZES = {
    "sqlite": {"new": 2000, "replays": 20000},
    "postgres": {"new": 2000, "replays": 10000, "group_each": 500, "group_procs": 4},
}

# Bare raw: a row shaped like the one OpenOnce writes (same columns set, same indexed
# values changing), without the journal line and without Python-side checks.
_RAW_INSERT = (
    "INSERT INTO bench_raw (id, tool, idempotency_key, scope, state, args_json,"
    " args_fingerprint, provider_key, attempt, max_attempts, fence, lease_owner,"
    " lease_expires_at, created_at, updated_at)"
    " VALUES (?, ?, ?, NULL, 'started', ?, ?, ?, 1, 3, 1, ?, ?, ?, ?)"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
)
_RAW_UPDATE = (
    "UPDATE bench_raw SET state = 'committed', fence = 2, lease_owner = NULL,"
    " lease_expires_at = NULL, execution_status = 'returned', execution_evidence_json = ?,"
    " result_json = ?, updated_at = ? WHERE id = ?"
)
_RAW_SELECT = (
    f"SELECT {SELECT_COLUMNS} FROM bench_raw"
    " WHERE tool = ? AND idempotency_key = ? AND state <> 'released'"
)
_RAW_FINGERPRINT = "sha256:" + "0" * 64
_RAW_PROVIDER_KEY = "oo_" + "0" * 40
_RAW_OWNER = f"{platform.node()}:{os.getpid()}"

# The floor (issue 20): the same row OpenOnce writes, every column a claim carries, and the
# same journal lines, on copies of the ledger's own tables and indexes. No tombstone check,
# no fence in the update's condition, no Python-side checks: the least the journal needs.
_FX_INSERT = (
    f"INSERT INTO bench_fx ({', '.join(NEW_COLUMNS)}) VALUES ({', '.join('?' * len(NEW_COLUMNS))})"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
)
_FX_UPDATE_SET = (
    "UPDATE bench_fx SET state = 'committed', fence = 2, updated_at = ?, lease_owner = NULL,"
    " lease_expires_at = NULL, next_probe_at = NULL, execution_status = 'returned',"
    " execution_evidence_json = ?, result_json = ?, error_json = NULL WHERE id = ?"
)
_FX_LINE = f"INSERT INTO bench_fx_journal ({JOURNAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
_FX_SELECT = (
    "SELECT id, state, result_json, error_json, args_fingerprint, fence FROM bench_fx"
    " WHERE tool = ? AND idempotency_key = ? AND state <> 'released'"
)
# Postgres: each commit is one statement, the journal line written by a CTE (one round trip,
# as the store does it).
_FX_LINE_FROM = (
    f"INSERT INTO bench_fx_journal ({JOURNAL_COLUMNS})"
    " SELECT e.id, %s, %s, %s, %s, %s, %s, %s FROM e"
)
_PG_FX_INSERT = f"WITH e AS ({_FX_INSERT.replace('?', '%s')} RETURNING id) {_FX_LINE_FROM}"
_PG_FX_UPDATE = f"WITH e AS ({_FX_UPDATE_SET.replace('?', '%s')} RETURNING id) {_FX_LINE_FROM}"

# Minimal raw + journal: bare raw plus the least a journal line can be (effect id and the
# state moved to) in a table with only its key, in the same commit as each raw statement.
_MIN_JOURNAL_DDL = {
    "sqlite": "CREATE TABLE bench_min_journal"
    " (seq INTEGER PRIMARY KEY, effect_id text NOT NULL, to_state text NOT NULL)",
    "postgres": "CREATE TABLE bench_min_journal"
    " (seq bigserial PRIMARY KEY, effect_id text NOT NULL, to_state text NOT NULL)",
}
_MIN_LINE = "INSERT INTO bench_min_journal (effect_id, to_state) VALUES (?, ?)"
_PG_MIN_INSERT = (
    f"WITH e AS ({_RAW_INSERT.replace('?', '%s')} RETURNING id)"
    " INSERT INTO bench_min_journal (effect_id, to_state) SELECT e.id, 'started' FROM e"
)
_PG_MIN_UPDATE = (
    f"WITH e AS ({_RAW_UPDATE.replace('?', '%s')} RETURNING id)"
    " INSERT INTO bench_min_journal (effect_id, to_state) SELECT e.id, 'committed' FROM e"
)


def _pg(statement: str) -> str:
    return statement.replace("?", "%s")


def raw_table_ddl(
    dialect: str, table: str = "openonce_effects", copy: str = "bench_raw"
) -> list[str]:
    """Every statement that shapes ``table`` (table, indexes, later ALTERs), in migration
    order, renamed to ``copy``: the copy maintains the same indexes. Triggers are left out:
    the ledger's refuse updates and deletes of the journal, which the hot path never does."""
    statements = []
    for _, batch in sorted(migrations(dialect).items()):
        for stmt in batch:
            text = " ".join(stmt.split())
            if "TRIGGER" in text or "FUNCTION" in text:
                continue
            if (
                text.startswith((f"CREATE TABLE {table} ", f"ALTER TABLE {table} "))
                or text.startswith(f"DROP INDEX IF EXISTS {table}_")  # replaced later
                or f" ON {table} " in text
            ):
                statements.append(text.replace(table, copy))
    return statements


def floor_table_ddl(dialect: str) -> list[str]:
    """The floor's copies of the ledger's tables: the same DDL on SQLite, ``LIKE ...
    INCLUDING ALL`` on Postgres (columns, defaults, constraints, every index)."""
    if dialect == "postgres":
        return [
            "CREATE TABLE bench_fx (LIKE openonce_effects INCLUDING ALL)",
            "CREATE TABLE bench_fx_journal (LIKE openonce_journal INCLUDING ALL)",
        ]
    return raw_table_ddl("sqlite", "openonce_effects", "bench_fx") + raw_table_ddl(
        "sqlite", "openonce_journal", "bench_fx_journal"
    )


# -- the sides of each measurement ----------------------------------------------------------


class Handler:
    """The tool OpenOnce wraps: returns a small dict, and counts how often it really ran."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, n: int) -> dict[str, Any]:
        self.calls += 1
        return {"n": n, "status": "sent"}


def make_effect(oo: OpenOnce, handler: Handler) -> Callable[[int], Any]:
    def bench_send(n: int) -> dict[str, Any]:
        return handler(n)

    send: Callable[[int], Any] = oo.effect(bench_send, tool=TOOL, idempotency_key=lambda n: f"k{n}")
    return send


def ours_new(send: Callable[[int], Any], handler: Handler, keys: Sequence[int]) -> float:
    before = handler.calls
    start = time.perf_counter()
    for n in keys:
        send(n)
    elapsed = time.perf_counter() - start
    if handler.calls - before != len(keys):  # not `assert`: must hold under python -O too
        raise AssertionError(f"{len(keys)} fresh keys ran the handler {handler.calls - before}x")
    return elapsed


def ours_replay(send: Callable[[int], Any], handler: Handler, keys: Sequence[int]) -> float:
    before = handler.calls
    start = time.perf_counter()
    for n in keys:
        if send(n)["n"] != n:
            raise AssertionError(f"replay of k{n} returned another effect's result")
    elapsed = time.perf_counter() - start
    if handler.calls != before:
        raise AssertionError(f"the handler ran {handler.calls - before} times on replay")
    return elapsed


def raw_new(conn: Any, insert: str, update: str, keys: Sequence[int]) -> float:
    """Two autocommit statements per call: each is its own durable commit."""
    start = time.perf_counter()
    for n in keys:
        at = time.time()
        row_id = "eff_" + uuid.uuid4().hex
        conn.execute(insert, _raw_row(row_id, n, at))
        conn.execute(update, ('{"attempt":1}', f'{{"n":{n},"status":"sent"}}', time.time(), row_id))
    return time.perf_counter() - start


def _raw_row(row_id: str, n: int, at: float) -> tuple[Any, ...]:
    return (
        row_id, TOOL, f"k{n}", f'{{"n":{n}}}', _RAW_FINGERPRINT, _RAW_PROVIDER_KEY, _RAW_OWNER,
        at + 300.0, at, at,
    )  # fmt: skip


def _fx_row(row_id: str, n: int, at: float) -> list[Any]:
    """Every column a claim carries (NEW_COLUMNS' order), as OpenOnce fills them."""
    values = {
        "id": row_id, "tool": TOOL, "idempotency_key": f"k{n}", "scope": None,
        "state": "started", "args_json": f'{{"n":{n}}}', "args_fingerprint": _RAW_FINGERPRINT,
        "provider_key": _RAW_PROVIDER_KEY, "attempt": 1, "max_attempts": 3, "fence": 1,
        "lease_owner": _RAW_OWNER, "lease_expires_at": at + 300.0, "approvals_required": 0,
        "approval_ttl": None, "created_at": at, "updated_at": at,
    }  # fmt: skip
    return [values[c] for c in NEW_COLUMNS]


_ACTOR = f"agent:{_RAW_OWNER}"


def floor_new_sqlite(conn: Any, keys: Sequence[int]) -> float:
    """Two transactions per call, each the effect statement and its journal line."""
    start = time.perf_counter()
    for n in keys:
        at = time.time()
        row_id = "eff_" + uuid.uuid4().hex
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute(_FX_INSERT, _fx_row(row_id, n, at)).rowcount == 1:
            conn.execute(_FX_LINE, (row_id, at, "planned", "started", _ACTOR, "",
                                    '{"attempt":1}', "claim"))  # fmt: skip
        conn.execute("COMMIT")
        at = time.time()
        conn.execute("BEGIN IMMEDIATE")
        done = conn.execute(
            _FX_UPDATE_SET, (at, '{"attempt":1}', f'{{"n":{n},"status":"sent"}}', row_id)
        )
        if done.rowcount == 1:
            conn.execute(_FX_LINE, (row_id, at, "started", "committed", _ACTOR, "",
                                    '{"attempt":1}', "finish"))  # fmt: skip
        conn.execute("COMMIT")
    return time.perf_counter() - start


def floor_new_pg(conn: Any, keys: Sequence[int]) -> float:
    """Two autocommit statements per call, each writing the effect and its journal line."""
    start = time.perf_counter()
    for n in keys:
        at = time.time()
        row_id = "eff_" + uuid.uuid4().hex
        conn.execute(
            _PG_FX_INSERT,
            [*_fx_row(row_id, n, at), at, "planned", "started", _ACTOR, "", '{"attempt":1}',
             "claim"],
        )  # fmt: skip
        at = time.time()
        conn.execute(
            _PG_FX_UPDATE,
            (at, '{"attempt":1}', f'{{"n":{n},"status":"sent"}}', row_id, at, "started",
             "committed", _ACTOR, "", '{"attempt":1}', "finish"),
        )  # fmt: skip
    return time.perf_counter() - start


def minimal_new_sqlite(conn: Any, keys: Sequence[int]) -> float:
    """Bare raw's two statements, each in a transaction with a minimal journal line."""
    start = time.perf_counter()
    for n in keys:
        at = time.time()
        row_id = "eff_" + uuid.uuid4().hex
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_RAW_INSERT, _raw_row(row_id, n, at))
        conn.execute(_MIN_LINE, (row_id, "started"))
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            _RAW_UPDATE, ('{"attempt":1}', f'{{"n":{n},"status":"sent"}}', time.time(), row_id)
        )
        conn.execute(_MIN_LINE, (row_id, "committed"))
        conn.execute("COMMIT")
    return time.perf_counter() - start


def minimal_new_pg(conn: Any, keys: Sequence[int]) -> float:
    start = time.perf_counter()
    for n in keys:
        at = time.time()
        row_id = "eff_" + uuid.uuid4().hex
        conn.execute(_PG_MIN_INSERT, _raw_row(row_id, n, at))
        conn.execute(
            _PG_MIN_UPDATE, ('{"attempt":1}', f'{{"n":{n},"status":"sent"}}', time.time(), row_id)
        )
    return time.perf_counter() - start


def raw_replay(cursor: Any, select: str, keys: Sequence[int]) -> float:
    start = time.perf_counter()
    for n in keys:
        cursor.execute(select, (TOOL, f"k{n}"))
        if cursor.fetchone() is None:
            raise AssertionError(f"raw row k{n} missing")
    return time.perf_counter() - start


# -- bookkeeping ----------------------------------------------------------------------------

# The sides a measure may have: ours, the floor the budget is against, and the two limits.
SIDE_NAMES = {
    "ours": "ours",
    "floor": "floor (raw + same journal, same tables)",
    "raw": "bare raw",
    "minimal": "minimal raw + journal",
}


@dataclass
class Line:
    store: str
    measure: str
    n: str
    budget: float
    rounds: dict[str, list[float]] = field(default_factory=dict)  # side -> ops/s per round

    def best(self, side: str) -> float:
        return max(self.rounds[side])

    @property
    def ours(self) -> float:
        return self.best("ours")

    @property
    def floor(self) -> float:
        return self.best("floor")

    @property
    def ratio(self) -> float:
        return self.ours / self.floor

    def limit(self, side: str) -> float | None:
        """ours / a limit side, best against best; None when this measure has no such side."""
        return self.ours / self.best(side) if self.rounds.get(side) else None

    @property
    def verdict(self) -> str:
        return "PASS" if self.ratio >= self.budget else "BELOW"

    def as_dict(self) -> dict[str, Any]:
        limits = {side: self.limit(side) for side in ("raw", "minimal")}
        return {
            **asdict(self),
            "rounds": {side: [round(v, 1) for v in r] for side, r in self.rounds.items()},
            "best_per_s": {side: round(self.best(side), 1) for side in self.rounds},
            "ratio": round(self.ratio, 4),
            "ours_over_raw": None if limits["raw"] is None else round(limits["raw"], 4),
            "ours_over_minimal": None if limits["minimal"] is None else round(limits["minimal"], 4),
            "overhead_us_per_op": round(1e6 / self.ours - 1e6 / self.floor, 1),
            "verdict": self.verdict,
        }


class Keys:
    """Hands out integer ranges so every new effect, on either side, gets a fresh key."""

    def __init__(self) -> None:
        self._next = 0

    def take(self, count: int) -> range:
        block = range(self._next, self._next + count)
        self._next += count
        return block


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sides(round_no: int, names: Sequence[str] = ("ours", "floor")) -> tuple[str, ...]:
    # Rotate who goes first, so a warming cache or a checkpoint does not favour a side.
    shift = round_no % len(names)
    return tuple(names[shift:]) + tuple(names[:shift])


def chunks(keys: Sequence[int], count: int) -> list[Sequence[int]]:
    size = -(-len(keys) // count)
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def interleaved(
    order: tuple[str, ...],
    work: dict[str, Sequence[int]],
    run: dict[str, Callable[[Any], float]],
) -> dict[str, float]:
    """Ops/s per side, running the sides in alternating chunks: a slow patch of the disk
    (another tenant's fsyncs, a WAL checkpoint) then lands on all of them, not on one."""
    parts = {side: chunks(work[side], CHUNKS) for side in order}
    spent = dict.fromkeys(order, 0.0)
    gc.collect()
    for i in range(CHUNKS):
        for side in order:
            spent[side] += run[side](parts[side][i])
    return {side: len(work[side]) / spent[side] for side in order}


def cycle(keys: range, count: int) -> list[int]:
    return [keys[i % len(keys)] for i in range(count)]


def run_rounds(
    store: str,
    rounds: int,
    sizes: dict[str, int],
    new: dict[str, Callable[[range], float]],
    replay: dict[str, Callable[[Sequence[int]], float]],
    keys: Keys,
) -> list[Line]:
    """Rounds of new effects then replays of those same keys, the sides interleaved. A
    replay side reads the keys its own new-effect side wrote (the floor's read, the keys
    the floor wrote; bare raw's, bare raw's)."""
    n_new, n_replay = sizes["new"], sizes["replays"]
    new_line = Line(store, "new effects", str(n_new), BUDGET_NEW)
    replay_line = Line(store, "replays", str(n_replay), BUDGET_REPLAY[store])
    for side in new:  # warm-up, untimed
        warm = keys.take(WARMUP)
        new[side](warm)
        if side in replay:
            replay[side](cycle(warm, WARMUP * 4))
    for r in range(rounds):
        order = sides(r, tuple(new))
        written = {side: keys.take(n_new) for side in order}
        for side, rate in interleaved(order, written, new).items():
            new_line.rounds.setdefault(side, []).append(rate)
        reading = tuple(side for side in order if side in replay)
        again = {side: cycle(written[side], n_replay) for side in reading}
        for side, rate in interleaved(reading, again, replay).items():
            replay_line.rounds.setdefault(side, []).append(rate)
        say(
            f"  {store} round {r + 1}/{rounds}: new "
            + ", ".join(f"{s} {new_line.rounds[s][-1]:,.0f}/s" for s in new)
            + "; replays "
            + ", ".join(f"{s} {replay_line.rounds[s][-1]:,.0f}/s" for s in replay)
        )
    return [new_line, replay_line]


# -- SQLite ---------------------------------------------------------------------------------


def bench_sqlite(rounds: int, settings: dict[str, Any]) -> list[Line]:
    keys = Keys()
    workdir = tempfile.mkdtemp(prefix="openonce-bench-")
    path = os.path.join(workdir, "ledger.db")
    oo = OpenOnce(path)  # installs the schema; WAL, synchronous=FULL, one conn per thread
    raw = sqlite3.connect(path, isolation_level=None)  # autocommit: a statement, a commit
    try:
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")
        for stmt in [*raw_table_ddl("sqlite"), *floor_table_ddl("sqlite")]:
            raw.execute(stmt)
        raw.execute(_MIN_JOURNAL_DDL["sqlite"])
        sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
        settings["sqlite"] = {
            "version": sqlite3.sqlite_version,
            "journal_mode": raw.execute("PRAGMA journal_mode").fetchone()[0],
            "raw_synchronous": sync[raw.execute("PRAGMA synchronous").fetchone()[0]],
            "store_synchronous": getattr(oo.store, "synchronous", "?"),
            "tmpdir": tempfile.gettempdir(),
        }
        handler = Handler()
        send = make_effect(oo, handler)
        cursor = raw.cursor()
        lines = run_rounds(
            "sqlite",
            rounds,
            SIZES["sqlite"],
            new={
                "ours": lambda keys: ours_new(send, handler, keys),
                "floor": lambda keys: floor_new_sqlite(raw, keys),
                "raw": lambda keys: raw_new(raw, _RAW_INSERT, _RAW_UPDATE, keys),
                "minimal": lambda keys: minimal_new_sqlite(raw, keys),
            },
            replay={
                "ours": lambda keys: ours_replay(send, handler, keys),
                "floor": lambda keys: raw_replay(cursor, _FX_SELECT, keys),
                "raw": lambda keys: raw_replay(cursor, _RAW_SELECT, keys),
            },
            keys=keys,
        )
        settings["costs"].append(sqlite_costs(oo, send, handler, keys))
        return lines
    finally:
        oo.close()
        raw.close()
        shutil.rmtree(workdir, ignore_errors=True)


def sqlite_costs(oo: OpenOnce, send: Callable[[int], Any], handler: Handler, keys: Keys) -> str:
    """Statements and commits per new effect and per replay, counted by SQLite itself."""
    seen: list[str] = []
    conn = oo.store._conn()  # type: ignore[attr-defined]  # this thread's connection
    conn.set_trace_callback(seen.append)
    try:
        fresh = keys.take(200)
        ours_new(send, handler, fresh)
        new_statements, new_commits = len(seen), seen.count("COMMIT")
        seen.clear()
        ours_replay(send, handler, fresh)
        replay_statements, replay_commits = len(seen), seen.count("COMMIT")
    finally:
        conn.set_trace_callback(None)
    n = len(fresh)
    return (
        f"sqlite per new effect: {new_statements / n:g} statements, {new_commits / n:g} commits;"
        f" per replay: {replay_statements / n:g} statements, {replay_commits / n:g} commits"
    )


# -- Postgres -------------------------------------------------------------------------------


@contextmanager
def pg_schema(dsn: str) -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped (with everything in it) after."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield make_conninfo(dsn, options=f"-csearch_path={schema}")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def open_pg(dsn: str, *, migrate: bool = False, prepare: bool | None = None) -> OpenOnce:
    from openonce_core.stores.postgres import PostgresStore

    return OpenOnce(PostgresStore(dsn, prepare=prepare), migrate=migrate)


def bench_postgres(
    base_dsn: str, rounds: int, settings: dict[str, Any], prepare: bool | None = None
) -> list[Line]:
    import psycopg

    with pg_schema(base_dsn) as dsn:
        oo = open_pg(dsn, migrate=True, prepare=prepare)
        raw = psycopg.connect(dsn, autocommit=True)
        try:
            for stmt in [*raw_table_ddl("postgres"), *floor_table_ddl("postgres")]:
                raw.execute(stmt)
            raw.execute(_MIN_JOURNAL_DDL["postgres"])
            show = {
                name: str(raw.execute(f"SHOW {name}").fetchone()[0])
                for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
            }
            settings["postgres"] = show
            if show["fsync"] != "on" or show["synchronous_commit"] == "off":
                say("WARNING: this server does not make commits durable; ratios mean little")
            handler = Handler()
            send = make_effect(oo, handler)
            cursor = raw.cursor()
            keys = Keys()  # one allocator for the whole schema: no key is ever reused
            lines = run_rounds(
                "postgres",
                rounds,
                SIZES["postgres"],
                new={
                    "ours": lambda keys: ours_new(send, handler, keys),
                    "floor": lambda keys: floor_new_pg(raw, keys),
                    "raw": lambda keys: raw_new(raw, _pg(_RAW_INSERT), _pg(_RAW_UPDATE), keys),
                    "minimal": lambda keys: minimal_new_pg(raw, keys),
                },
                replay={
                    "ours": lambda keys: ours_replay(send, handler, keys),
                    "floor": lambda keys: raw_replay(cursor, _pg(_FX_SELECT), keys),
                    "raw": lambda keys: raw_replay(cursor, _pg(_RAW_SELECT), keys),
                },
                keys=keys,
            )
            settings["costs"].append(pg_costs(oo, send, handler, raw, keys))
        finally:
            oo.close()
            raw.close()
        lines.append(bench_pg_group(dsn, rounds, keys, prepare))
        return lines


def pg_costs(
    oo: OpenOnce, send: Callable[[int], Any], handler: Handler, raw: Any, keys: Keys
) -> str:
    """Round trips and WAL bytes per new effect and per replay, ours beside raw. WAL is read
    from the server (pg_current_wal_insert_lsn), so other sessions' writes add noise."""
    pool: Any = oo.store.pool  # type: ignore[attr-defined]
    real = pool.get
    trips = [0]

    def counting() -> Any:
        # Every statement on the hot path is one lend of a pooled connection.
        trips[0] += 1
        return real()

    def wal() -> Any:
        return raw.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]

    def wal_since(lsn: Any) -> int:
        return int(raw.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)", (lsn,))
                   .fetchone()[0])  # fmt: skip

    n = 200
    fresh, raw_keys = keys.take(n), keys.take(n)
    pool.get = counting
    try:
        before = wal()
        ours_new(send, handler, fresh)
        new_wal, new_trips = wal_since(before), trips[0]
        trips[0] = 0
        before = wal()
        ours_replay(send, handler, fresh)
        replay_wal, replay_trips = wal_since(before), trips[0]
    finally:
        pool.get = real
    before = wal()
    raw_new(raw, _pg(_RAW_INSERT), _pg(_RAW_UPDATE), raw_keys)
    raw_new_wal = wal_since(before)
    before = wal()
    raw_replay(raw.cursor(), _pg(_RAW_SELECT), raw_keys)
    raw_replay_wal = wal_since(before)
    return (
        f"postgres per new effect: ours {new_trips / n:g} round trips, {new_wal / n:,.0f} WAL"
        f" bytes; raw 2 statements, {raw_new_wal / n:,.0f} WAL bytes. Per replay: ours"
        f" {replay_trips / n:g} round trips, {replay_wal / n:,.0f} WAL bytes; raw 1 read,"
        f" {raw_replay_wal / n:,.0f} WAL bytes"
    )


GROUP_SIDES = ("ours", "floor", "raw")


def bench_pg_group(dsn: str, rounds: int, keys: Keys, prepare: bool | None = None) -> Line:
    procs, each = SIZES["postgres"]["group_procs"], SIZES["postgres"]["group_each"]
    line = Line("postgres", f"new effects, {procs} processes", f"{procs}x{each}", BUDGET_GROUP)
    for r in range(rounds):
        for side in sides(r, GROUP_SIDES):
            blocks = [keys.take(WARMUP + each) for _ in range(procs)]
            line.rounds.setdefault(side, []).append(run_group(side, dsn, blocks, prepare))
        say(
            f"  postgres {procs} processes round {r + 1}/{rounds}: "
            + ", ".join(f"{s} {line.rounds[s][-1]:,.0f}/s" for s in GROUP_SIDES)
        )
    return line


def run_group(side: str, dsn: str, blocks: list[range], prepare: bool | None = None) -> float:
    """Start one process per block, let them all warm up, then release them together.
    Throughput is all their calls over the span from the first start to the last finish."""
    ctx = mp.get_context("spawn")
    messages: Any = ctx.Queue()
    go = ctx.Event()
    workers = [
        ctx.Process(
            target=group_worker, args=(side, dsn, block, messages, go, prepare), daemon=True
        )
        for block in blocks
    ]
    for w in workers:
        w.start()
    try:
        ready = 0
        while ready < len(workers):
            kind, *rest = messages.get(timeout=120)
            if kind == "error":
                raise RuntimeError(f"{side} worker failed:\n{rest[0]}")
            ready += 1
        go.set()
        done = []
        while len(done) < len(workers):
            kind, *rest = messages.get(timeout=300)
            if kind == "error":
                raise RuntimeError(f"{side} worker failed:\n{rest[0]}")
            done.append(rest)
    finally:
        go.set()  # after a failure, release the waiting workers so they finish and exit
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.terminate()  # only our own worker, by its handle
    total = sum(count for count, _, _ in done)
    span = max(end for _, _, end in done) - min(start for _, start, _ in done)
    return total / span


def group_worker(
    side: str, dsn: str, block: range, messages: Any, go: Any, prepare: bool | None = None
) -> None:
    """One process of the group: warm up on the first keys of its block, then time the rest."""
    try:
        warm, timed_keys = block[:WARMUP], block[WARMUP:]
        if side == "ours":
            oo = open_pg(dsn, prepare=prepare)
            handler = Handler()
            send = make_effect(oo, handler)

            def run(keys: Sequence[int]) -> float:
                return ours_new(send, handler, keys)

            close: Callable[[], None] = oo.close
        else:
            import psycopg

            conn = psycopg.connect(dsn, autocommit=True)
            insert, update = _pg(_RAW_INSERT), _pg(_RAW_UPDATE)

            def run(keys: Sequence[int]) -> float:
                if side == "floor":
                    return floor_new_pg(conn, keys)
                return raw_new(conn, insert, update, keys)

            close = conn.close
        run(warm)
        messages.put(("ready",))
        go.wait(120)
        # CLOCK_MONOTONIC is system-wide on Linux, so spans compare across processes.
        start = time.monotonic()
        run(timed_keys)
        end = time.monotonic()
        messages.put(("done", len(timed_keys), start, end))
        close()
    except BaseException:
        messages.put(("error", traceback.format_exc()))


# -- report ---------------------------------------------------------------------------------


def code_revision() -> str:
    """The commit measured, and whether openonce_core differs from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "openonce_core")
    except OSError:
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes in openonce_core" if dirty else "")


def shown(ratio: float) -> float:
    # Truncated, not rounded: 0.5997 must not print as 0.600 next to "BELOW".
    return math.floor(ratio * 1000) / 1000


def render(lines: list[Line], settings: dict[str, Any], rounds: int, notes: list[str]) -> str:
    out = [
        f"OpenOnce ledger hot path vs its floor, same machine, same run: best of {rounds}"
        f" rounds, the sides interleaved in {CHUNKS} chunks per round",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {settings['revision']}",
    ]
    if "sqlite" in settings:
        s = settings["sqlite"]
        out.append(
            f"sqlite {s['version']}: journal_mode={s['journal_mode']},"
            f" synchronous={s['store_synchronous']} (store) / {s['raw_synchronous']} (raw)"
        )
    if "postgres" in settings:
        p = settings["postgres"]
        out.append(
            f"postgres {p['server_version']}: synchronous_commit={p['synchronous_commit']},"
            f" fsync={p['fsync']}, wal_sync_method={p['wal_sync_method']};"
            " store prepares: "
            + ("no (--no-prepare)" if settings["prepare"] is False else "when direct")
        )
    out.append("")
    header = (
        f"{'store':<9}{'measure':<28}{'n':>8}{'ours/s':>10}{'floor/s':>10}"
        f"{'ours/floor':>11}{'budget':>8}{'+us/op':>9}  verdict {'/raw':>7}{'/min':>7}"
    )
    out += [header, "-" * len(header)]
    for line in lines:
        overhead = 1e6 / line.ours - 1e6 / line.floor
        limits = "".join(
            f"{shown(v):>7.3f}" if (v := line.limit(side)) is not None else f"{'-':>7}"
            for side in ("raw", "minimal")
        )
        out.append(
            f"{line.store:<9}{line.measure:<28}{line.n:>8}{line.ours:>10,.0f}"
            f"{line.floor:>10,.0f}{shown(line.ratio):>11.3f}"
            f"{'>=' + format(line.budget, '.1f'):>8}{overhead:>9,.0f}  {line.verdict:<7}{limits}"
        )
    out.append(
        "floor: raw plus the same journal lines on copies of the ledger's tables (replays: the"
        " same table's single-row read); +us/op: what ours adds to each call over the floor"
        " (1e6/ours - 1e6/floor); /raw, /min: ours over bare raw and over minimal raw +"
        " journal (the limit figures)"
    )
    out.append("")
    out.append(
        "per round, ops/s of each side, ours/floor, and the median ratio (the spread is this"
        " machine's noise):"
    )
    for line in lines:
        per_round = []
        for i, ours in enumerate(line.rounds["ours"]):
            others = ", ".join(
                f"{side} {line.rounds[side][i]:,.0f}" for side in line.rounds if side != "ours"
            )
            per_round.append(
                f"ours {ours:,.0f} / {others} = {shown(ours / line.rounds['floor'][i]):.3f}"
            )
        median = statistics.median(
            o / f for o, f in zip(line.rounds["ours"], line.rounds["floor"], strict=True)
        )
        out.append(
            f"  {line.store} {line.measure}: "
            + "; ".join(per_round)
            + f"; median {shown(median):.3f}"
        )
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sqlite-only", action="store_true", help="skip Postgres")
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG"),
        help="Postgres DSN to create a scratch schema in (default: $OPENONCE_BENCH_PG)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measure (best wins)")
    parser.add_argument(
        "--no-prepare",
        dest="prepare",
        action="store_const",
        const=False,
        default=None,
        help="no server-side prepared statements on Postgres (as behind pgbouncer)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    settings: dict[str, Any] = {
        "revision": code_revision(),
        "costs": [],
        "prepare": args.prepare,
    }
    notes: list[str] = []
    started = time.monotonic()
    say("sqlite ...")
    lines = bench_sqlite(args.rounds, settings)
    if args.sqlite_only:
        notes.append("Postgres skipped (--sqlite-only)")
    elif not args.pg_dsn:
        notes.append("Postgres skipped: pass --pg-dsn or set OPENONCE_BENCH_PG")
    else:
        say("postgres ...")
        lines += bench_postgres(args.pg_dsn, args.rounds, settings, args.prepare)
    elapsed = time.monotonic() - started

    if args.json:
        report = {
            "rounds": args.rounds,
            "chunks_per_round": CHUNKS,
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "settings": settings,
            "results": [line.as_dict() for line in lines],
            "all_pass": all(line.verdict == "PASS" for line in lines),
            "seconds": round(elapsed, 1),
            "notes": notes,
        }
        print(json.dumps(report, indent=2))
    else:
        notes = [*settings["costs"], *notes, f"took {elapsed:.0f} s"]
        print(render(lines, settings, args.rounds, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
