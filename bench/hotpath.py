"""The ledger's hot path against the raw limit of the same database, in one run.

For SQLite and Postgres on this machine, side by side:

* new effects/s through OpenOnce (fresh explicit key per call) vs a bare persistent
  connection doing, per call, ``INSERT ... ON CONFLICT DO NOTHING`` of a comparable row
  and one ``UPDATE`` of it, each its own durable commit;
* replays/s (the same keys again; the handler must not run) vs a single-row ``SELECT``
  by the unique key;
* on Postgres, four processes doing new effects together vs four raw clients.

The raw table ``bench_raw`` is a copy of ``openonce_effects`` (table and indexes, taken
from ``openonce_core._schema``) in the same database, so both sides pay the same index
maintenance and the same fsyncs. Durability is the store's: SQLite in WAL with
``synchronous=FULL``, Postgres with the server's ``synchronous_commit`` (on by default).

Each round runs ours and raw back to back, alternating which goes first; a side's result
is its best round. Usage::

    python bench/hotpath.py [--sqlite-only] [--pg-dsn DSN] [--json] [--rounds N] [--no-prepare]

By default the store decides (``PostgresStore(prepare=None)``: server-side prepared
statements on a direct TCP connection, as here); ``--no-prepare`` measures it as behind
pgbouncer, preparing nothing. The raw client keeps psycopg's default (it prepares a
statement on its fifth run).

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
from openonce_core.stores.sql import SELECT_COLUMNS

TOOL = "bench_send"
WARMUP = 50  # calls per side before timing: connections, prepared statements, caches
CHUNKS = 10  # ours and raw alternate this many times within a round

# The hot-path budget (ARCHITECTURE.md, issue 11): ours / raw must reach at least this.
BUDGET_NEW = 0.8
BUDGET_REPLAY = {"sqlite": 0.3, "postgres": 1.0}
BUDGET_GROUP = 0.8

SIZES = {
    "sqlite": {"new": 2000, "replays": 20000},
    "postgres": {"new": 2000, "replays": 10000, "group_each": 500, "group_procs": 4},
}

# The raw client writes a row shaped like the one OpenOnce writes (same columns set, same
# indexed values changing), without the journal line and without Python-side checks.
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


def _pg(statement: str) -> str:
    return statement.replace("?", "%s")


def raw_table_ddl(dialect: str) -> list[str]:
    """Every statement that shapes openonce_effects (table, indexes, later ALTERs), in
    migration order, renamed to bench_raw: the raw side maintains the same indexes."""
    statements = []
    for _, batch in sorted(migrations(dialect).items()):
        for stmt in batch:
            text = " ".join(stmt.split())
            if (
                text.startswith(("CREATE TABLE openonce_effects ", "ALTER TABLE openonce_effects "))
                or text.startswith("DROP INDEX IF EXISTS openonce_effects_")  # replaced later
                or " ON openonce_effects " in text
            ):
                statements.append(text.replace("openonce_effects", "bench_raw"))
    return statements


# -- the two sides of each measurement ------------------------------------------------------


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
        conn.execute(
            insert,
            (
                row_id,
                TOOL,
                f"k{n}",
                f'{{"n":{n}}}',
                _RAW_FINGERPRINT,
                _RAW_PROVIDER_KEY,
                _RAW_OWNER,
                at + 300.0,
                at,
                at,
            ),
        )
        conn.execute(update, ('{"attempt":1}', f'{{"n":{n},"status":"sent"}}', time.time(), row_id))
    return time.perf_counter() - start


def raw_replay(cursor: Any, select: str, keys: Sequence[int]) -> float:
    start = time.perf_counter()
    for n in keys:
        cursor.execute(select, (TOOL, f"k{n}"))
        if cursor.fetchone() is None:
            raise AssertionError(f"raw row k{n} missing")
    return time.perf_counter() - start


# -- bookkeeping ----------------------------------------------------------------------------


@dataclass
class Line:
    store: str
    measure: str
    n: str
    budget: float
    ours_rounds: list[float] = field(default_factory=list)  # ops/s per round
    raw_rounds: list[float] = field(default_factory=list)

    @property
    def ours(self) -> float:
        return max(self.ours_rounds)

    @property
    def raw(self) -> float:
        return max(self.raw_rounds)

    @property
    def ratio(self) -> float:
        return self.ours / self.raw

    @property
    def verdict(self) -> str:
        return "PASS" if self.ratio >= self.budget else "BELOW"

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ours_rounds": [round(v, 1) for v in self.ours_rounds],
            "raw_rounds": [round(v, 1) for v in self.raw_rounds],
            "ours_per_s": round(self.ours, 1),
            "raw_per_s": round(self.raw, 1),
            "ratio": round(self.ratio, 4),
            "overhead_us_per_op": round(1e6 / self.ours - 1e6 / self.raw, 1),
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


def sides(round_no: int) -> tuple[str, str]:
    # Alternate who goes first, so a warming cache or a checkpoint does not favour a side.
    return ("ours", "raw") if round_no % 2 == 0 else ("raw", "ours")


def chunks(keys: Sequence[int], count: int) -> list[Sequence[int]]:
    size = -(-len(keys) // count)
    return [keys[i : i + size] for i in range(0, len(keys), size)]


def interleaved(
    order: tuple[str, str],
    work: dict[str, Sequence[int]],
    run: dict[str, Callable[[Any], float]],
) -> dict[str, float]:
    """Ops/s per side, running the two sides in alternating chunks: a slow patch of the
    disk (another tenant's fsyncs, a WAL checkpoint) then lands on both, not on one."""
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
    """Rounds of new effects then replays of those same keys, ours and raw interleaved."""
    n_new, n_replay = sizes["new"], sizes["replays"]
    new_line = Line(store, "new effects", str(n_new), BUDGET_NEW)
    replay_line = Line(store, "replays", str(n_replay), BUDGET_REPLAY[store])
    for side in ("ours", "raw"):  # warm-up, untimed
        warm = keys.take(WARMUP)
        new[side](warm)
        replay[side](cycle(warm, WARMUP * 4))
    for r in range(rounds):
        order = sides(r)
        written = {side: keys.take(n_new) for side in order}
        rates = interleaved(order, written, new)
        new_line.ours_rounds.append(rates["ours"])
        new_line.raw_rounds.append(rates["raw"])
        again = {side: cycle(written[side], n_replay) for side in order}
        rates = interleaved(order, again, replay)
        replay_line.ours_rounds.append(rates["ours"])
        replay_line.raw_rounds.append(rates["raw"])
        say(
            f"  {store} round {r + 1}/{rounds}: new ours {new_line.ours_rounds[-1]:,.0f}/s"
            f" raw {new_line.raw_rounds[-1]:,.0f}/s; replays ours"
            f" {replay_line.ours_rounds[-1]:,.0f}/s raw {replay_line.raw_rounds[-1]:,.0f}/s"
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
        for stmt in raw_table_ddl("sqlite"):
            raw.execute(stmt)
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
                "raw": lambda keys: raw_new(raw, _RAW_INSERT, _RAW_UPDATE, keys),
            },
            replay={
                "ours": lambda keys: ours_replay(send, handler, keys),
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
            for stmt in raw_table_ddl("postgres"):
                raw.execute(stmt)
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
                    "raw": lambda keys: raw_new(raw, _pg(_RAW_INSERT), _pg(_RAW_UPDATE), keys),
                },
                replay={
                    "ours": lambda keys: ours_replay(send, handler, keys),
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


def bench_pg_group(dsn: str, rounds: int, keys: Keys, prepare: bool | None = None) -> Line:
    procs, each = SIZES["postgres"]["group_procs"], SIZES["postgres"]["group_each"]
    line = Line("postgres", f"new effects, {procs} processes", f"{procs}x{each}", BUDGET_GROUP)
    for r in range(rounds):
        for side in sides(r):
            blocks = [keys.take(WARMUP + each) for _ in range(procs)]
            rate = run_group(side, dsn, blocks, prepare)
            (line.ours_rounds if side == "ours" else line.raw_rounds).append(rate)
        say(
            f"  postgres {procs} processes round {r + 1}/{rounds}:"
            f" ours {line.ours_rounds[-1]:,.0f}/s raw {line.raw_rounds[-1]:,.0f}/s"
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
        f"OpenOnce ledger hot path vs raw limit, same machine, same run: best of {rounds}"
        f" rounds, ours and raw interleaved in {CHUNKS} chunks per round",
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
        f"{'store':<9}{'measure':<28}{'n':>8}{'ours/s':>10}{'raw/s':>10}"
        f"{'ours/raw':>10}{'budget':>8}{'+us/op':>9}  verdict"
    )
    out += [header, "-" * len(header)]
    for line in lines:
        overhead = 1e6 / line.ours - 1e6 / line.raw
        out.append(
            f"{line.store:<9}{line.measure:<28}{line.n:>8}{line.ours:>10,.0f}{line.raw:>10,.0f}"
            f"{shown(line.ratio):>10.3f}{'>=' + format(line.budget, '.1f'):>8}{overhead:>9,.0f}"
            f"  {line.verdict}"
        )
    out.append("+us/op: what ours adds to each call over raw (1e6/ours - 1e6/raw)")
    out.append("")
    out.append(
        "per round, ops/s ours / raw = ratio, and the median ratio (the spread is this"
        " machine's noise):"
    )
    for line in lines:
        pairs = list(zip(line.ours_rounds, line.raw_rounds, strict=True))
        rounds_text = ", ".join(f"{o:,.0f} / {r:,.0f} = {shown(o / r):.3f}" for o, r in pairs)
        median = statistics.median(o / r for o, r in pairs)
        out.append(f"  {line.store} {line.measure}: {rounds_text}; median {shown(median):.3f}")
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
