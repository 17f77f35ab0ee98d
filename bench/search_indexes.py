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
the median ratio over the rounds (and each round's, to show the spread). Usage::

    python bench/search_indexes.py [--calls N] [--rounds R] [--pg-dsn DSN]
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

from hotpath import _RAW_INSERT, _RAW_UPDATE, _pg, raw_new, say

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from openonce_core._schema import _V1, _V3_SEARCH_PG

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
    args = parser.parse_args(argv)

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
