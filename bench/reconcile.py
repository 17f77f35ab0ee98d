"""How fast the reconciler drains a backlog of UNKNOWN effects, against the raw limit.

For SQLite and Postgres on this machine, side by side:

* ``N`` effects (10,000 by default) are created through OpenOnce itself: a ``stripe.charge``
  handler that raises ``TimeoutError`` leaves each effect UNKNOWN, with the two journal
  lines (planned -> started -> unknown) the core writes. No row is written by hand.
* ours: ``Reconciler(oo, grace_seconds=0).run_once(limit=L)`` in a loop until nothing is
  due, with an instant prober that answers HAPPENED with a receipt bound to the effect's
  provider key (so every effect commits). Reported: probes resolved per second and the
  time to drain the backlog (the sum of the ``run_once`` calls).
* raw: a bare persistent connection resolving a copy of the same rows (tables
  ``bench_raw``/``bench_raw_journal``, same columns and indexes as ``openonce_effects``/
  ``openonce_journal``, filled with the same effects and journal lines) with the least a
  resolution costs: one ``SELECT`` by id, then one conditional ``UPDATE ... WHERE id AND
  state AND fence`` and one journal ``INSERT`` in one durable commit (on Postgres one
  statement with a data-modifying CTE, on SQLite ``BEGIN IMMEDIATE`` ... ``COMMIT``). Raw
  does not select due effects or probe: its ids are listed before timing.

Ours and raw alternate: after each ``run_once`` raw resolves as many rows as it committed,
so a slow patch of the disk lands on both. Afterwards every effect, on both sides, must be
committed with exactly one journal line into ``committed``. Usage::

    python bench/reconcile.py [--effects N] [--limit L] [--sqlite-only] [--pg-dsn DSN] [--json]

The Postgres DSN defaults to ``$OPENONCE_BENCH_PG``; the script creates a schema of its own
there (``?options=-csearch_path=...``) and drops it at the end; the SQLite file lives in a
temporary directory that is removed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hotpath import code_revision, open_pg, pg_schema, say

from openonce_core import OpenOnce
from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core._reconcile import Reconciler
from openonce_core._records import Effect
from openonce_core._schema import migrations
from openonce_core.errors import OutcomeUnknownError
from openonce_core.stores.sql import JOURNAL_COLUMNS, SELECT_COLUMNS

TOOL = "stripe.charge"  # the built-in "stripe" capability: receipts need a stripe_id
DEFAULT_EFFECTS = 10_000
DEFAULT_LIMIT = 500  # Reconciler.run_once's own default
CREATE_THREADS = {"sqlite": 1, "postgres": 4}  # SQLite has one writer anyway


# -- the backlog ----------------------------------------------------------------------------


def order_of(n: int) -> str:
    return f"paid-{n:07d}"


def create_unknown(oo: OpenOnce, count: int, threads: int = 1) -> float:
    """``count`` UNKNOWN effects through the real path; returns effects/s.

    Each call claims the effect (STARTED, one commit), its handler raises TimeoutError (the
    request may have left), and the core records UNKNOWN (the second commit)."""

    def charge(order: str, amount: int) -> dict[str, Any]:
        raise TimeoutError("read timed out")  # the provider may or may not have charged

    send = oo.effect(charge, tool=TOOL, idempotency_key=lambda order, amount: order)

    def make(numbers: range) -> None:
        for n in numbers:
            try:
                send(order_of(n), 100 + n % 900)
            except OutcomeUnknownError:
                continue
            raise AssertionError(f"{order_of(n)} did not end UNKNOWN")

    step = -(-count // threads)
    blocks = [range(i, min(i + step, count)) for i in range(0, count, step)]
    start = time.perf_counter()
    if threads == 1:
        make(blocks[0])
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(make, blocks))
    return count / (time.perf_counter() - start)


class InstantProber:
    """The provider answers at once: the charge exists, its receipt names this effect."""

    def probe(self, effect: Effect) -> ProbeResult:
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt={"stripe_id": "pi_" + str(effect.args["order"])},
            detail="found by metadata search",
            provider_reference=effect.provider_key,
        )


# -- the raw side ---------------------------------------------------------------------------


def raw_tables_ddl(dialect: str) -> list[str]:
    """Every statement that shapes openonce_effects and openonce_journal (tables, indexes),
    in migration order, renamed to bench_raw and bench_raw_journal. Triggers are left out:
    the journal's only refuse UPDATE and DELETE, which neither side issues."""
    renames = {"openonce_effects": "bench_raw", "openonce_journal": "bench_raw_journal"}
    statements = []
    for _, batch in sorted(migrations(dialect).items()):
        for stmt in batch:
            text = " ".join(stmt.split())
            for table, copy in renames.items():
                if (
                    text.startswith((f"CREATE TABLE {table} ", f"ALTER TABLE {table} "))
                    or text.startswith(f"DROP INDEX IF EXISTS {table}_")  # replaced later
                    or (
                        text.startswith(("CREATE INDEX", "CREATE UNIQUE INDEX"))
                        and f" ON {table} " in text
                    )
                ):
                    statements.append(text.replace(table, copy))
    return statements


def raw_copy(execute: Callable[[str], Any]) -> None:
    """Fill the raw tables with the effects and journal lines OpenOnce just wrote."""
    execute("INSERT INTO bench_raw SELECT * FROM openonce_effects")
    execute(
        f"INSERT INTO bench_raw_journal ({JOURNAL_COLUMNS})"
        f" SELECT {JOURNAL_COLUMNS} FROM openonce_journal ORDER BY seq"
    )


_RAW_SELECT = f"SELECT {SELECT_COLUMNS} FROM bench_raw WHERE id = ?"
_FENCE = SELECT_COLUMNS.split(", ").index("fence")
_ARGS = SELECT_COLUMNS.split(", ").index("args_json")
_RAW_UPDATE = (
    "UPDATE bench_raw SET state = 'committed', fence = ?, updated_at = ?, result_json = ?,"
    " verification_status = 'confirmed', verification_evidence_json = ?"
    " WHERE id = ? AND state = 'unknown' AND fence = ?"
)
_RAW_JOURNAL = (
    f"INSERT INTO bench_raw_journal ({JOURNAL_COLUMNS})"
    " VALUES (?, ?, 'unknown', 'committed', 'reconciler:bench', 'found by metadata search', ?)"
)
# Postgres: the update and its journal line in one statement, one round trip, one commit.
_RAW_PG = (
    "WITH u AS (UPDATE bench_raw SET state = 'committed', fence = %s, updated_at = %s,"
    " result_json = %s, verification_status = 'confirmed', verification_evidence_json = %s"
    " WHERE id = %s AND state = 'unknown' AND fence = %s RETURNING id)"
    f" INSERT INTO bench_raw_journal ({JOURNAL_COLUMNS})"
    " SELECT u.id, %s, 'unknown', 'committed', 'reconciler:bench', 'found by metadata search',"
    " %s FROM u RETURNING seq"
)


def _receipt(row: Any) -> tuple[int, str, str]:
    """From the row read: the next fence, the receipt and the evidence, as JSON text."""
    order = json.loads(row[_ARGS])["order"]
    receipt = f'{{"stripe_id":"pi_{order}"}}'
    evidence = f'{{"observations":[{{"outcome":"happened","receipt":{receipt}}}]}}'
    return row[_FENCE] + 1, receipt, evidence


def raw_sqlite(conn: sqlite3.Connection, ids: Sequence[str]) -> float:
    start = time.perf_counter()
    for effect_id in ids:
        row = conn.execute(_RAW_SELECT, (effect_id,)).fetchone()
        fence, receipt, evidence = _receipt(row)
        at = time.time()
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute(_RAW_UPDATE, (fence, at, receipt, evidence, effect_id, fence - 1)).rowcount:
            conn.execute(_RAW_JOURNAL, (effect_id, at, evidence))
            conn.execute("COMMIT")
        else:
            conn.execute("ROLLBACK")
            raise AssertionError(f"raw {effect_id} was not unknown at fence {fence - 1}")
    return time.perf_counter() - start


def raw_postgres(conn: Any, ids: Sequence[str]) -> float:
    cursor = conn.cursor()
    select = _RAW_SELECT.replace("?", "%s")
    start = time.perf_counter()
    for effect_id in ids:
        row = cursor.execute(select, (effect_id,)).fetchone()
        fence, receipt, evidence = _receipt(row)
        at = time.time()
        params = (fence, at, receipt, evidence, effect_id, fence - 1, at, evidence)
        if cursor.execute(_RAW_PG, params).fetchone() is None:
            raise AssertionError(f"raw {effect_id} was not unknown at fence {fence - 1}")
    return time.perf_counter() - start


# -- one store ------------------------------------------------------------------------------


@dataclass
class Result:
    store: str
    effects: int
    limit: int
    created_per_s: float = 0.0
    ours_seconds: float = 0.0  # sum of run_once calls until nothing was due
    raw_seconds: float = 0.0
    runs: int = 0
    run_rates: list[float] = field(default_factory=list)  # resolved/s of each run_once
    checks: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ours(self) -> float:
        return self.effects / self.ours_seconds

    @property
    def raw(self) -> float:
        return self.effects / self.raw_seconds

    def as_dict(self) -> dict[str, Any]:
        doc = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        doc["run_rates"] = [round(r, 1) for r in self.run_rates]
        doc.update(
            ours_per_s=round(self.ours, 1),
            raw_per_s=round(self.raw, 1),
            ratio=round(self.ours / self.raw, 4),
            overhead_us_per_effect=round(1e6 / self.ours - 1e6 / self.raw, 1),
        )
        return doc


def drain(
    store: str,
    oo: OpenOnce,
    count: int,
    limit: int,
    raw_ids: list[str],
    raw_run: Callable[[Sequence[str]], float],
) -> Result:
    """Ours until nothing is due, raw resolving as many rows after each of ours' runs."""
    result = Result(store, count, limit)
    reconciler = Reconciler(oo, grace_seconds=0)
    reconciler.register(TOOL, InstantProber())
    done = 0
    gc.collect()
    try:
        while True:
            start = time.perf_counter()
            report = reconciler.run_once(limit=limit)
            spent = time.perf_counter() - start
            if report.escalated or report.rearmed or report.retried or report.lost_races:
                raise AssertionError(f"{store}: a run did more than commit: {report}")
            if not report.committed:
                break  # the run that finds nothing due closes the drain, and is counted
            result.ours_seconds += spent
            result.runs += 1
            result.run_rates.append(len(report.committed) / spent)
            result.raw_seconds += raw_run(raw_ids[done : done + len(report.committed)])
            done += len(report.committed)
            say(
                f"  {store}: {done:,}/{count:,} committed; this run"
                f" {result.run_rates[-1]:,.0f}/s (still unknown: {report.waiting})"
            )
        result.ours_seconds += spent
        result.runs += 1
    finally:
        reconciler.close()
    if done != count:
        raise AssertionError(f"{store}: drained {done} effects of {count}")
    return result


_CHECKS = {
    "committed": "SELECT count(*) FROM {e} WHERE state = 'committed'",
    "not committed": "SELECT count(*) FROM {e} WHERE state <> 'committed'",
    "lines ->committed": "SELECT count(*) FROM {j} WHERE to_state = 'committed'",
    "with exactly one": (
        "SELECT count(*) FROM (SELECT effect_id FROM {j} WHERE to_state = 'committed'"
        " GROUP BY effect_id HAVING count(*) = 1) AS once"
    ),
}


SIDES = (
    ("ours", "openonce_effects", "openonce_journal"),
    ("raw", "bench_raw", "bench_raw_journal"),
)


def verify(
    store: str,
    query: Callable[[str], int],
    count: int,
    sides: Sequence[tuple[str, str, str]] = SIDES,
) -> dict[str, dict[str, int]]:
    """Each side (name, effects table, journal table) committed every one of ``count``
    effects, and its journal holds exactly one line into ``committed`` for each."""
    found: dict[str, dict[str, int]] = {}
    for side, effects, journal in sides:
        found[side] = {
            name: query(sql.format(e=effects, j=journal)) for name, sql in _CHECKS.items()
        }
        for name, got in found[side].items():
            want = 0 if name == "not committed" else count
            if got != want:
                raise AssertionError(f"{store} {side}: {name} = {got}, expected {want}")
    return found


def bench_sqlite(count: int, limit: int, settings: dict[str, Any]) -> Result:
    workdir = tempfile.mkdtemp(prefix="openonce-bench-")
    path = os.path.join(workdir, "reconcile.db")
    oo = OpenOnce(path)  # installs the schema; WAL, synchronous=FULL
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute("PRAGMA synchronous=FULL")
        settings["sqlite"] = {
            "version": sqlite3.sqlite_version,
            "store_synchronous": getattr(oo.store, "synchronous", "?"),
            "tmpdir": tempfile.gettempdir(),
        }
        say(f"sqlite: creating {count:,} UNKNOWN effects through OpenOnce ...")
        created = create_unknown(oo, count, CREATE_THREADS["sqlite"])
        for stmt in raw_tables_ddl("sqlite"):
            raw.execute(stmt)
        raw.execute("BEGIN IMMEDIATE")
        raw_copy(raw.execute)
        raw.execute("COMMIT")
        ids = [r[0] for r in raw.execute("SELECT id FROM bench_raw ORDER BY updated_at, id")]
        result = drain("sqlite", oo, count, limit, ids, lambda part: raw_sqlite(raw, part))
        result.created_per_s = created
        result.checks = verify("sqlite", lambda q: raw.execute(q).fetchone()[0], count)
        return result
    finally:
        oo.close()
        raw.close()
        shutil.rmtree(workdir, ignore_errors=True)


def bench_postgres(base_dsn: str, count: int, limit: int, settings: dict[str, Any]) -> Result:
    import psycopg

    with pg_schema(base_dsn) as dsn:
        oo = open_pg(dsn, migrate=True)
        raw = psycopg.connect(dsn, autocommit=True)
        try:
            show = {
                name: str(raw.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
                for name in ("server_version", "synchronous_commit", "fsync")
            }
            settings["postgres"] = show
            if show["fsync"] != "on" or show["synchronous_commit"] == "off":
                say("WARNING: this server does not make commits durable; ratios mean little")
            say(f"postgres: creating {count:,} UNKNOWN effects through OpenOnce ...")
            created = create_unknown(oo, count, CREATE_THREADS["postgres"])
            for stmt in raw_tables_ddl("postgres"):
                raw.execute(stmt)
            with raw.transaction():
                raw_copy(raw.execute)
            raw.execute("ANALYZE")  # both sides' tables just grew from nothing
            ids = [r[0] for r in raw.execute("SELECT id FROM bench_raw ORDER BY updated_at, id")]
            result = drain("postgres", oo, count, limit, ids, lambda part: raw_postgres(raw, part))
            result.created_per_s = created
            result.checks = verify(
                "postgres",
                lambda q: raw.execute(q).fetchone()[0],  # type: ignore[index]
                count,
            )
            return result
        finally:
            oo.close()
            raw.close()


# -- report ---------------------------------------------------------------------------------


def render(results: list[Result], settings: dict[str, Any], notes: list[str]) -> str:
    out = [
        "OpenOnce reconciler draining a backlog of due UNKNOWN effects vs raw limit,"
        " same machine, same run (ours and raw alternate after every run_once)",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {settings['revision']}",
    ]
    if "sqlite" in settings:
        s = settings["sqlite"]
        out.append(f"sqlite {s['version']}: WAL, synchronous={s['store_synchronous']}")
    if "postgres" in settings:
        p = settings["postgres"]
        out.append(
            f"postgres {p['server_version']}: synchronous_commit={p['synchronous_commit']},"
            f" fsync={p['fsync']}"
        )
    out.append("")
    header = (
        f"{'store':<9}{'effects':>8}{'limit':>7}{'runs':>6}{'ours/s':>9}{'drain s':>9}"
        f"{'raw/s':>9}{'raw s':>8}{'ours/raw':>10}{'+us/op':>8}{'created/s':>11}"
    )
    out += [header, "-" * len(header)]
    for r in results:
        out.append(
            f"{r.store:<9}{r.effects:>8,}{r.limit:>7}{r.runs:>6}{r.ours:>9,.0f}"
            f"{r.ours_seconds:>9.2f}{r.raw:>9,.0f}{r.raw_seconds:>8.2f}"
            f"{r.ours / r.raw:>10.3f}{1e6 / r.ours - 1e6 / r.raw:>8,.0f}{r.created_per_s:>11,.0f}"
        )
    out += [
        "ours/s: probes resolved (committed) per second by Reconciler.run_once(limit);"
        " drain s: ours' time to empty",
        "  the backlog (every run, including the last one that finds nothing due)",
        "raw/s: SELECT by id + conditional UPDATE + journal INSERT in one commit, per effect"
        " (no selection, no probe)",
        "+us/op: what ours adds per effect (1e6/ours - 1e6/raw); created/s: how fast the"
        " backlog was made through OpenOnce",
        "",
        "resolved/s of each run_once, first to last (the backlog shrinks by `limit` each run):",
    ]
    for r in results:
        rates = ", ".join(f"{v:,.0f}" for v in r.run_rates)
        out.append(f"  {r.store}: {rates}")
    out.append("")
    out.append("exactly once, from each side's own tables and journal:")
    head = f"  {'store':<9}{'side':<6}" + "".join(f"{name:>19}" for name in _CHECKS)
    out.append(head)
    for r in results:
        for side, checks in r.checks.items():
            cells = "".join(f"{checks[name]:>19,}" for name in _CHECKS)
            out.append(f"  {r.store:<9}{side:<6}{cells}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=DEFAULT_EFFECTS, help="backlog size")
    parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, help="run_once(limit=)")
    parser.add_argument("--sqlite-only", action="store_true", help="skip Postgres")
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG"),
        help="Postgres DSN to create a scratch schema in (default: $OPENONCE_BENCH_PG)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.effects < 1 or args.limit < 1:
        parser.error("--effects and --limit must be at least 1")

    settings: dict[str, Any] = {"revision": code_revision()}
    notes: list[str] = []
    started = time.monotonic()
    results = [bench_sqlite(args.effects, args.limit, settings)]
    if args.sqlite_only:
        notes.append("Postgres skipped (--sqlite-only)")
    elif not args.pg_dsn:
        notes.append("Postgres skipped: pass --pg-dsn or set OPENONCE_BENCH_PG")
    else:
        results.append(bench_postgres(args.pg_dsn, args.effects, args.limit, settings))
    elapsed = time.monotonic() - started

    if args.json:
        report = {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "settings": settings,
            "results": [r.as_dict() for r in results],
            "seconds": round(elapsed, 1),
            "notes": notes,
        }
        print(json.dumps(report, indent=2))
    else:
        print(render(results, settings, [*notes, f"took {elapsed:.0f} s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
