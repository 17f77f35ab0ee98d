"""The MCP gateway's added latency per call, against calling the upstream directly over the
same transport, beside the ledger's own two commits (issue 22).

For each transport and each store, one call at a time, the sides interleaved call by call
(a slow patch of the disk lands on every side alike), each call timed on its own:

* **direct**: the MCP client calls the upstream's ``pay`` itself (a fresh order each call);
* **gateway fresh**: the same call through the gateway, a fresh order: the ledger's claim,
  the upstream call, the finish;
* **gateway replay**: an order the gateway already ran: answered from the ledger, the
  upstream not called;
* **pass-through**: an unlisted tool through the gateway (one more hop, no ledger);
* **@oo.effect**: an in-process ``@oo.effect`` handler around the direct call, the same
  store: what an agent that can import Python pays;
* **two commits**: the ledger's floor on the same store, raw SQL on a bare connection: two
  durable commits with one journal row each (``bench/hotpath.py``'s floor, one effect).

Budgets (issue 22): a fresh call adds at most 2 ms at p50 beyond the ledger's two commits
(gateway fresh p50 - direct p50 - two commits p50 <= 2 ms), and a replay is faster than
the direct call (gateway replay p50 < direct p50).

Transports: ``memory`` (the SDK's in-process transport, client, gateway and upstream in this
process: the gateway's own cost) and ``stdio`` (as deployed: the gateway is ``openonce
mcp-proxy`` in a child process, its upstream a child of it; the direct side is a child
process of its own). Usage::

    python bench/mcp.py [--rounds N] [--calls N] [--transport memory|stdio|both]
                        [--sqlite-only] [--pg-dsn DSN] [--json]
    python bench/mcp.py --upstream      # the upstream MCP server, on stdio (used by the bench)

The Postgres DSN defaults to ``$OPENONCE_BENCH_PG`` (``make bench-mcp`` sets it); the script
creates a schema of its own there and drops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

HERE = Path(__file__).resolve().parent
# Run as ``python bench/mcp.py``, Python puts bench/ first on sys.path, where ``mcp`` is
# this file and not the SDK: take bench/ off, and load the neighbour bench by its path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent))


def _neighbour(name: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


hotpath = _neighbour("hotpath")
code_revision, say = hotpath.code_revision, hotpath.say

BUDGET_ADDED_MS = 2.0  # p50, a fresh call, beyond the ledger's two commits
WARMUP = 30  # calls per side before timing
CALLS = 300  # timed calls per side per round

UPSTREAM_MS = "OO_BENCH_UPSTREAM_MS"  # how long the upstream's pay takes (--upstream-ms)

SIDES = ("direct", "gateway fresh", "gateway replay", "pass-through", "@oo.effect", "two commits")


# -- the upstream ----------------------------------------------------------------------------


def make_upstream() -> Any:
    """The upstream MCP server: ``pay`` (the recorded tool: a small dict back), ``lookup``
    (passed through) and ``paid`` (how many pays it served: the bench checks replays did
    not reach it)."""
    import anyio
    from mcp.server.mcpserver import MCPServer

    app = MCPServer("bench-upstream")
    served = [0]

    work = float(os.environ.get(UPSTREAM_MS, "0")) / 1000  # the provider's own time

    @app.tool()
    async def pay(order: str, amount_cents: int) -> dict[str, Any]:
        """Charge an order."""
        served[0] += 1
        if work:
            await anyio.sleep(work)
        return {"order": order, "charged": amount_cents, "payment": f"pay_{order}"}

    @app.tool()
    def lookup(order: str) -> str:
        """Read an order."""
        return f"order {order}: open"

    @app.tool()
    def paid() -> int:
        """How many pay calls this server served."""
        return served[0]

    return app


def gateway_config(upstream: dict[str, Any]) -> dict[str, Any]:
    return {
        "upstream": {"bench": upstream},
        "scope": "bench",
        "tools": {"pay": {"tool": "bench.pay", "idempotency_fields": ["order"]}},
    }


# -- the stores ------------------------------------------------------------------------------


@dataclass
class Store:
    """A ledger target the gateway and the @oo.effect side use, and the floor's connection
    on the same database."""

    name: str
    target: str  # what ``--db`` takes
    floor: Callable[[range], float]
    close: Callable[[], None]
    settings: dict[str, str] = field(default_factory=dict)


@contextmanager
def sqlite_store() -> Iterator[Store]:
    from openonce_core import OpenOnce

    workdir = tempfile.mkdtemp(prefix="openonce-bench-mcp-")
    path = os.path.join(workdir, "ledger.db")
    OpenOnce(path).close()  # installs the schema
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    for stmt in hotpath.floor_table_ddl("sqlite"):
        raw.execute(stmt)
    try:
        yield Store(
            "sqlite",
            path,
            lambda keys: hotpath.floor_new_sqlite(raw, keys),
            raw.close,
            {"sqlite": f"{sqlite3.sqlite_version}, WAL, synchronous=FULL"},
        )
    finally:
        raw.close()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def postgres_store(base_dsn: str) -> Iterator[Store]:
    import psycopg

    with hotpath.pg_schema(base_dsn) as dsn:
        hotpath.open_pg(dsn, migrate=True).close()
        raw = psycopg.connect(dsn, autocommit=True)
        for stmt in hotpath.floor_table_ddl("postgres"):
            raw.execute(stmt)
        schema = str(raw.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
        show = {
            name: str(raw.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "synchronous_commit", "fsync")
        }
        # A URL the gateway's ``--db`` takes, its search_path on the scratch schema.
        sep = "&" if "?" in base_dsn else "?"
        target = f"{base_dsn}{sep}options={quote(f'-csearch_path={schema}')}"
        try:
            yield Store(
                "postgres",
                target,
                lambda keys: hotpath.floor_new_pg(raw, keys),
                raw.close,
                {"postgres": ", ".join(f"{k}={v}" for k, v in show.items())},
            )
        finally:
            raw.close()


# -- the sides -------------------------------------------------------------------------------


@asynccontextmanager
async def clients(transport: str, store: Store, workdir: Path) -> AsyncIterator[dict[str, Any]]:
    """The direct client, the gateway's client, and the ledger client the @oo.effect side
    uses, connected over ``transport``."""
    from mcp import Client, StdioServerParameters

    from openonce_core import OpenOnce
    from openonce_core.integrations.mcp import (
        build_server,
        make_client,
        open_gateway,
        parse_config,
    )

    async with AsyncExitStack() as stack:
        if transport == "memory":
            upstream = make_upstream()
            config = parse_config(gateway_config({"command": "in-process"}))
            oo = make_client(store.target, config)
            stack.callback(oo.close)
            gateway = await stack.enter_async_context(
                open_gateway(config, oo, targets={"bench": upstream})
            )
            through = await stack.enter_async_context(Client(build_server(gateway)))
            direct = await stack.enter_async_context(Client(upstream))
        else:
            me = [sys.executable, str(Path(__file__).resolve()), "--upstream"]
            env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
            path = workdir / "openonce-mcp.json"
            path.write_text(json.dumps(gateway_config({"command": me[0], "args": me[1:]})))
            proxy = ["-m", "openonce_core.cli", "--db", store.target, "mcp-proxy", "--config",
                     str(path)]  # fmt: skip
            through = await stack.enter_async_context(
                Client(
                    StdioServerParameters(
                        command=sys.executable, args=proxy, env=env, cwd=str(HERE.parent)
                    )
                )
            )
            direct = await stack.enter_async_context(
                Client(StdioServerParameters(command=me[0], args=me[1:], env=env))
            )
        effects = OpenOnce(store.target)
        stack.callback(effects.close)
        yield {"direct": direct, "gateway": through, "oo": effects}


class Run:
    """One store on one transport: every side's latencies, in ms, per round."""

    def __init__(self, transport: str, store: Store) -> None:
        self.transport = transport
        self.store = store
        self.rounds: dict[str, list[list[float]]] = {side: [] for side in SIDES}

    def all(self, side: str) -> list[float]:
        return [ms for r in self.rounds[side] for ms in r]

    def p(self, side: str, q: float) -> float:
        samples = sorted(self.all(side))
        return samples[min(len(samples) - 1, int(q * len(samples)))]

    @property
    def added(self) -> float:
        """What a fresh call through the gateway adds beyond the direct call and the
        ledger's two commits, at p50."""
        return self.p("gateway fresh", 0.5) - self.p("direct", 0.5) - self.p("two commits", 0.5)

    @property
    def fresh_verdict(self) -> str:
        return "PASS" if self.added <= BUDGET_ADDED_MS else "BELOW"

    @property
    def replay_verdict(self) -> str:
        return "PASS" if self.p("gateway replay", 0.5) < self.p("direct", 0.5) else "BELOW"


async def measure(run: Run, sides: dict[str, Any], rounds: int, calls: int) -> None:
    from openonce_core import OpenOnce

    direct, gateway = sides["direct"], sides["gateway"]
    oo: OpenOnce = sides["oo"]
    tag = uuid.uuid4().hex[:8]

    @oo.effect(tool="bench.direct_pay", idempotency_fields=["order"])
    async def pay(order: str, amount_cents: int) -> Any:
        answer = await direct.call_tool("pay", {"order": order, "amount_cents": amount_cents})
        return answer.model_dump(mode="json", by_alias=True, exclude_none=True)

    counter = [0]

    def next_order(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}-{tag}-{counter[0]}"

    replayable: list[str] = []

    async def fresh() -> None:
        order = next_order("g")
        answer = await gateway.call_tool("pay", {"order": order, "amount_cents": 1})
        if answer.is_error or (answer.meta or {}).get("openonce/outcome") != "executed":
            raise AssertionError(f"a fresh call through the gateway did not run: {answer}")
        replayable.append(order)

    async def replay() -> None:
        order = replayable[len(replayable) // 2]  # one the gateway ran, not the last one
        answer = await gateway.call_tool("pay", {"order": order, "amount_cents": 1})
        if (answer.meta or {}).get("openonce/outcome") != "replayed":
            raise AssertionError(f"a replay reached the upstream: {answer}")

    floor_keys = iter(range(10**9))  # the floor's table is this run's own: keys from 0

    def floor() -> float:
        n = next(floor_keys)
        return run.store.floor(range(n, n + 1))

    steps: dict[str, Callable[[], Awaitable[Any] | float]] = {
        "direct": lambda: direct.call_tool("pay", {"order": next_order("d"), "amount_cents": 1}),
        "gateway fresh": fresh,
        "gateway replay": replay,
        "pass-through": lambda: gateway.call_tool("lookup", {"order": "o"}),
        "@oo.effect": lambda: pay(next_order("e"), 1),
        "two commits": floor,
    }

    async def one(side: str) -> float:
        if side == "two commits":
            return floor() * 1000
        start = time.perf_counter()
        await steps[side]()  # type: ignore[misc]
        return (time.perf_counter() - start) * 1000

    with oo.scope("bench"):
        await fresh()
        for _ in range(WARMUP):
            for side in SIDES:
                await one(side)
        for r in range(rounds):
            samples: dict[str, list[float]] = {side: [] for side in SIDES}
            for i in range(calls):
                shift = (i + r) % len(SIDES)  # rotate who goes first
                for side in SIDES[shift:] + SIDES[:shift]:
                    samples[side].append(await one(side))
            for side in SIDES:
                run.rounds[side].append(samples[side])
            say(
                f"  {run.transport}/{run.store.name} round {r + 1}/{rounds}: p50 "
                + ", ".join(f"{s} {statistics.median(samples[s]):.2f}" for s in SIDES)
                + " ms"
            )
    served = await gateway.call_tool("paid", {})
    ran = int(served.structured_content["result"])  # type: ignore[index]
    fresh_calls = 1 + WARMUP + rounds * calls
    if run.transport == "memory":  # one upstream serves the direct and @oo.effect sides too
        fresh_calls += 2 * (WARMUP + rounds * calls)
    if ran != fresh_calls:  # a replay reached the upstream, or a fresh call ran twice
        raise AssertionError(f"the upstream served {ran} pays for {fresh_calls} fresh calls")


# -- the report ------------------------------------------------------------------------------


def render(runs: list[Run], rounds: int, calls: int, notes: list[str]) -> str:
    out = [
        "MCP gateway: latency per call against the upstream called directly over the same"
        f" transport; {rounds} rounds x {calls} calls per side, the sides interleaved call by"
        f" call; the upstream's pay takes {os.environ.get(UPSTREAM_MS, '0')} ms",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python"
        f" {platform.python_version()}; code: {code_revision()}",
    ]
    for run in runs:
        for key, value in run.store.settings.items():
            line = f"{key}: {value}"
            if line not in out:
                out.append(line)
    out.append("")
    header = f"{'transport':<10}{'store':<10}{'side':<16}{'p50 ms':>8}{'p99 ms':>8}{'+p50 ms':>9}"
    out += [header, "-" * len(header)]
    for run in runs:
        direct = run.p("direct", 0.5)
        for side in SIDES:
            plus = (
                f"{run.p(side, 0.5) - direct:>+9.2f}"
                if side not in ("direct", "two commits")
                else f"{'':>9}"
            )
            out.append(
                f"{run.transport:<10}{run.store.name:<10}{side:<16}"
                f"{run.p(side, 0.5):>8.2f}{run.p(side, 0.99):>8.2f}{plus}"
            )
        out.append("")
    out.append("+p50: the side's p50 minus the direct call's p50")
    out.append("")
    out.append(
        f"budgets: fresh adds <= {BUDGET_ADDED_MS:g} ms p50 beyond the ledger's two commits;"
        " a replay is faster than the direct call"
    )
    for run in runs:
        out.append(
            f"  {run.transport}/{run.store.name}: fresh {run.p('gateway fresh', 0.5):.2f}"
            f" - direct {run.p('direct', 0.5):.2f} - two commits {run.p('two commits', 0.5):.2f}"
            f" = {run.added:+.2f} ms  {run.fresh_verdict};  replay"
            f" {run.p('gateway replay', 0.5):.2f} vs direct {run.p('direct', 0.5):.2f} ms"
            f"  {run.replay_verdict} (pass-through, the same hop without the ledger:"
            f" {run.p('pass-through', 0.5):.2f})"
        )
    out.append("")
    out.append("per round, p50 ms (the spread is this machine's noise):")
    for run in runs:
        for side in ("direct", "gateway fresh", "gateway replay", "two commits"):
            per = ", ".join(f"{statistics.median(r):.2f}" for r in run.rounds[side])
            out.append(f"  {run.transport}/{run.store.name} {side}: {per}")
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def report(runs: list[Run], rounds: int, calls: int, notes: list[str]) -> dict[str, Any]:
    return {
        "rounds": rounds,
        "calls_per_round": calls,
        "upstream_ms": float(os.environ.get(UPSTREAM_MS, "0")),
        "revision": code_revision(),
        "results": [
            {
                "transport": run.transport,
                "store": run.store.name,
                "p50_ms": {s: round(run.p(s, 0.5), 3) for s in SIDES},
                "p99_ms": {s: round(run.p(s, 0.99), 3) for s in SIDES},
                "added_beyond_commits_ms": round(run.added, 3),
                "fresh_verdict": run.fresh_verdict,
                "replay_verdict": run.replay_verdict,
            }
            for run in runs
        ],
        "all_pass": all(r.fresh_verdict == r.replay_verdict == "PASS" for r in runs),
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", action="store_true", help="serve the upstream on stdio")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--calls", type=int, default=CALLS, help="timed calls per side per round")
    parser.add_argument("--transport", choices=("memory", "stdio", "both"), default="both")
    parser.add_argument(
        "--upstream-ms",
        type=float,
        default=0.0,
        help="how long the upstream's pay takes, in ms (default 0: the harshest case for a"
        " replay, which must then beat a hop to an upstream that does nothing)",
    )
    parser.add_argument("--sqlite-only", action="store_true", help="skip Postgres")
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG"),
        help="Postgres DSN to create a scratch schema in (default: $OPENONCE_BENCH_PG)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.upstream:
        make_upstream().run()
        return 0
    if args.rounds < 1 or args.calls < 2:
        parser.error("--rounds must be at least 1 and --calls at least 2")

    import anyio

    os.environ[UPSTREAM_MS] = str(args.upstream_ms)  # the stdio upstreams inherit it
    transports = ("memory", "stdio") if args.transport == "both" else (args.transport,)
    notes: list[str] = []
    stores: list[Callable[[], Any]] = [sqlite_store]
    if args.sqlite_only:
        notes.append("Postgres skipped (--sqlite-only)")
    elif not args.pg_dsn:
        notes.append("Postgres skipped: pass --pg-dsn or set OPENONCE_BENCH_PG")
    else:
        stores.append(lambda: postgres_store(args.pg_dsn))
    started = time.monotonic()
    runs: list[Run] = []
    for transport in transports:
        for open_store in stores:
            with open_store() as store, tempfile.TemporaryDirectory() as workdir:
                say(f"{transport}/{store.name} ...")
                run = Run(transport, store)

                async def go(
                    run: Run = run,
                    store: Store = store,
                    workdir: str = workdir,
                    transport: str = transport,
                ) -> None:
                    async with clients(transport, store, Path(workdir)) as sides:
                        await measure(run, sides, args.rounds, args.calls)

                anyio.run(go)
                runs.append(run)
    notes.append(f"took {time.monotonic() - started:.0f} s")
    if args.json:
        print(json.dumps(report(runs, args.rounds, args.calls, notes), indent=2))
    else:
        print(render(runs, args.rounds, args.calls, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
