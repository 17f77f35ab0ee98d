"""The nemesis soak: agents, the reconciler and a person against a Stripe-like provider while
a nemesis breaks things on a seeded schedule; then the provider's record is checked against
the ledger.

    make soak [DURATION=120] [SEED=1] [STORE=sqlite|postgres|both]
    .venv/bin/python bench/soak.py --duration 120 --seed 1 --store sqlite [--faults ...]

What runs (ARCHITECTURE.md, "The nemesis", lists every fault beside the invariant it
attacks):

* the provider (``soak_provider.py``, HTTP, in this process): takes payments, keeps
  Stripe's idempotency backstop, writes every request it receives to ``provider.jsonl``
  (fsynced): the independent truth;
* ``--agents`` agent processes (``soak_agent.py``) calling ``stripe.charge`` through
  ``OpenOnce`` on overlapping orders, re-running them;
* the reconciler with the reference ``StripeProber`` against the provider: on Postgres two
  Celery workers and one beat on a Redis of the soak's own (a private ``redis-server`` on a
  free port, so restarting it hurts nobody else), the agents and the daemon reaching
  Postgres through a TCP proxy (``soak_proxy.py``); on SQLite ``manage.py reconcile
  --watch``, the daemon's loop without Celery. The beat also runs the notifier (no channel);
* the nemesis, from ``random.Random(seed)``: the schedule is printed before it starts;
* a person: approves what waits for approval, resolves UNKNOWN / HUMAN_REVIEW effects on
  the provider's real evidence (happened with its PaymentIntent; not happened only when the
  provider never received a request with the effect's key).

After ``--duration`` the faults stop, the agents stop, every re-armed or approved order is
called once more, and the reconciler drains. Then the checker (``soak_check.py``) compares
and the report is printed; exit 1 on any violation, with the seed and the journal of the
first violating effect.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
for p in (str(REPO), str(BENCH)):
    if p not in sys.path:
        sys.path.append(p)

import psycopg  # noqa: E402
from soak_agent import Payer  # noqa: E402
from soak_check import INVARIANTS, Verdict, check, check_resources  # noqa: E402
from soak_provider import SoakStripe, read_record  # noqa: E402
from soak_proxy import PgProxy  # noqa: E402

from openonce_core import OpenOnce  # noqa: E402
from openonce_core._states import EffectState  # noqa: E402
from openonce_core.errors import OpenOnceError  # noqa: E402
from tests.support.daemon import (  # noqa: E402
    ADMIN_DSN,
    PYTHON,
    Proc,
    create_database,
    daemon_env,
    drop_database,
    migrate,
    spawn,
    start_beat,
)

S = EffectState
BOTH, PG = ("sqlite", "postgres"), ("postgres",)
# kind -> (stores it applies to, weight in the schedule)
KINDS: dict[str, tuple[tuple[str, ...], float]] = {
    "kill_agent": (BOTH, 3),
    "kill_in_flight": (BOTH, 1),
    "stop_agent": (BOTH, 2.5),
    "stop_agent_long": (BOTH, 0.5),
    "kill_reconciler": (BOTH, 1.5),
    "stop_reconciler": (BOTH, 1.5),
    "fork_prefork": (BOTH, 1),
    "fork_orphan": (BOTH, 1),
    "clock_step": (BOTH, 2),
    "reconciler_clock_step": (BOTH, 1),
    "pg_terminate": (PG, 2),
    "proxy_drop_commit": (PG, 2),
    "proxy_delay": (PG, 1.5),
    "redis_restart": (PG, 0.5),
    "provider_lost_reply": (BOTH, 2),
    "provider_no_answer": (BOTH, 1.5),
    "provider_429": (BOTH, 1.5),
    "provider_5xx": (BOTH, 1.5),
    "provider_slow": (BOTH, 1.5),
    "provider_stall": (BOTH, 1),
    "probe_errors": (BOTH, 1.5),
    "person": (BOTH, 4),
}
GROUPS = {
    "kill": ("kill_agent", "kill_in_flight", "kill_reconciler"),
    "stop": ("stop_agent", "stop_agent_long", "stop_reconciler"),
    "fork": ("fork_prefork", "fork_orphan"),
    "clock": ("clock_step", "reconciler_clock_step"),
    "pg": ("pg_terminate", "proxy_drop_commit", "proxy_delay"),
    "redis": ("redis_restart",),
    "provider": ("provider_lost_reply", "provider_no_answer", "provider_429", "provider_5xx",
                 "provider_slow", "provider_stall", "probe_errors"),
    "person": ("person",),
}  # fmt: skip
# Kinds that find violations in the current library go here, off by default until the
# library is fixed (CI runs the default); `--faults all` switches everything on.
KNOWN_FAILING: tuple[str, ...] = ()
DEFAULT_FAULTS = tuple(k for k in KINDS if k not in KNOWN_FAILING)


def parse_faults(text: str) -> tuple[str, ...]:
    """Kinds and groups, comma-separated: ``all``, ``default``, ``none``, a kind, a group
    (GROUPS), or ``-kind``/``-group`` to drop it from what came before (or the default)."""
    out: list[str] = []
    for word in (w.strip() for w in (text or "default").split(",")):
        if word == "none":
            continue
        if word.startswith("-"):
            drop = GROUPS.get(word[1:], (word[1:],))
            out = [k for k in (out or list(DEFAULT_FAULTS)) if k not in drop]
            continue
        names = {"all": tuple(KINDS), "default": DEFAULT_FAULTS}.get(word) or GROUPS.get(
            word, (word,)
        )
        for name in names:
            if name not in KINDS:
                raise SystemExit(f"unknown fault {name!r}; kinds: {', '.join(KINDS)}")
            if name not in out:
                out.append(name)
    return tuple(out)


@dataclass
class Config:
    duration: float = 120.0
    seed: int = 1
    store: str = "sqlite"
    agents: int = 4
    faults: tuple[str, ...] = DEFAULT_FAULTS
    out: str = ""
    drain: float = 100.0
    key_rate: float = 3.0  # new orders per second across the soak
    window: int = 40  # orders an agent picks from (the latest ones)
    lease: float = 6.0
    grace: float = 4.0  # the reconciler's grace before probing an UNKNOWN (> provider delay)
    stale_grace: float = 8.0  # after a lease's end before a miss may re-arm it
    mean_gap: float = 1.2  # seconds between two faults, on average
    idempotency: bool = True
    workers: int = 2
    keep: bool = False
    # SQLite: reconciler loop worker-1 runs as this uid (dropped after start, as `celery
    # --uid` does) when the soak runs as root; None: every process runs as the soak's user.
    reconciler_uid: int | None = None


@dataclass
class Event:
    at: float
    kind: str
    params: dict[str, Any]

    def __str__(self) -> str:
        args = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"t={self.at:7.2f}s  {self.kind:<20} {args}"


def schedule(cfg: Config) -> list[Event]:
    """The nemesis' plan, from the seed alone."""
    rng = random.Random(cfg.seed)
    kinds = [k for k in cfg.faults if cfg.store in KINDS[k][0]]
    if not kinds:
        return []
    weights = [KINDS[k][1] for k in kinds]
    events: list[Event] = []
    t = rng.uniform(2.0, 4.0)
    while t < cfg.duration - 2.0:
        kind = rng.choices(kinds, weights)[0]
        events.append(Event(round(t, 2), kind, _params(kind, rng, cfg)))
        t += rng.expovariate(1.0 / cfg.mean_gap)
    # Every kind asked for happens at least once (a rare kind can miss a short run).
    seen = {e.kind for e in events}
    for kind in (k for k in kinds if k not in seen and cfg.duration > 6.0):
        at = round(rng.uniform(2.0, cfg.duration - 4.0), 2)
        events.append(Event(at, kind, _params(kind, rng, cfg)))
    return sorted(events, key=lambda e: e.at)


def _params(kind: str, rng: random.Random, cfg: Config) -> dict[str, Any]:
    agent = rng.randrange(cfg.agents)
    worker = rng.randrange(cfg.workers)
    match kind:
        case "kill_agent":
            return {"agent": agent, "restart_after": round(rng.uniform(0.2, 2.0), 2)}
        case "stop_agent" | "stop_agent_long":
            # Inside a lease plus the stale-call grace (a stopped call the reconciler must
            # wait for); or, stop_agent_long, far past it (only the provider's backstop
            # helps, so `--no-provider-idempotency` runs leave it out).
            top = cfg.lease + cfg.stale_grace
            long = kind == "stop_agent_long"
            seconds = rng.uniform(top, top + 10) if long else rng.uniform(0.3, top * 0.8)
            return {"agent": agent, "seconds": round(seconds, 2)}
        case "kill_in_flight":
            # The request executes after the reconciler's grace, before the dead-owner grace.
            low, high = cfg.grace + 0.5, max(cfg.grace + 1.0, cfg.stale_grace - 1.0)
            return {"delay": round(rng.uniform(low, high), 2)}
        case "kill_reconciler":
            return {"worker": worker, "restart_after": round(rng.uniform(0.5, 3.0), 2)}
        case "stop_reconciler":
            return {"worker": worker, "seconds": round(rng.uniform(0.5, 8.0), 2)}
        case "fork_prefork" | "fork_orphan":
            # The parent closes its client (prefork: after parent_life; orphan: at once, and
            # exits) while its children still call.
            # SQLite: half of them on a ledger of the family's own, where nobody else holds
            # the database open and the parent's close is its last one.
            life = round(rng.uniform(4.0, 10.0), 1)
            return {"life": life, "children": rng.randint(2, 4),
                    "parent_life": round(life * rng.uniform(0.1, 0.5), 1),
                    "own_ledger": rng.random() < 0.5}  # fmt: skip
        case "clock_step":
            return {"agent": agent, "offset": round(rng.choice((-1, 1)) * rng.uniform(2, 60), 1),
                    "seconds": round(rng.uniform(2.0, 15.0), 1)}  # fmt: skip
        case "reconciler_clock_step":
            # The reconciler's host clock steps an hour (mostly forward), then back.
            return {"worker": worker, "offset": rng.choice((3600, 3600, -3600)),
                    "seconds": round(rng.uniform(3.0, 12.0), 1)}  # fmt: skip
        case "pg_terminate":
            return {"backends": rng.randint(1, 4)}
        case "proxy_drop_commit":
            return {"replies": rng.randint(1, 3)}
        case "proxy_delay":
            return {
                "delay": round(rng.uniform(0.05, 0.6), 2),
                "seconds": round(rng.uniform(1, 6), 1),
            }
        case "redis_restart":
            return {"down": round(rng.uniform(0.5, 3.0), 2)}
        case "provider_lost_reply" | "provider_429" | "provider_5xx":
            params: dict[str, Any] = {"requests": rng.randint(1, 4)}
            if kind == "provider_5xx":
                params["after_executing"] = rng.random() < 0.5
            return params
        case "provider_no_answer":
            return {"requests": rng.randint(1, 2), "executed": rng.random() < 0.6}
        case "provider_slow":
            return {"requests": rng.randint(1, 5), "delay": round(rng.uniform(0.3, 3.0), 2)}
        case "provider_stall":
            # Held past the reconciler's grace, inside the stale-call grace, its caller alive
            # (it gives up after 2 s and records UNKNOWN): the probe's miss is young.
            low, high = cfg.grace + 0.5, max(cfg.grace + 1.0, cfg.stale_grace - 1.0)
            return {"requests": rng.randint(1, 2), "delay": round(rng.uniform(low, high), 2)}
        case "probe_errors":
            return {"requests": rng.randint(2, 12), "status": rng.choice((429, 503, 500))}
        case "person":
            return {"pick": rng.random()}
    raise AssertionError(kind)


# -- processes -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def figures(pid: int) -> dict[str, float] | None:
    """fds, threads and RSS of a process (None if it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if values.get("State", "").strip().startswith(("Z", "X")):
        return None
    rss = float(values.get("VmRSS", "0 kB").split()[0]) / 1024
    return {"pid": pid, "fds": fds, "threads": float(values["Threads"]), "rss_mb": round(rss, 1)}


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


class Soak:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(f"{cfg.seed}:run")
        self.out = Path(cfg.out or tempfile.mkdtemp(prefix=f"soak-{cfg.store}-{cfg.seed}-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = self.out / "logs"
        self.stop_file = self.out / "stop"
        self.t0 = time.monotonic()
        self.injected: Counter[str] = Counter()
        self.notes: Counter[str] = Counter()
        self.person_did: Counter[str] = Counter()
        self.agents: dict[str, Proc] = {}
        self.extras: list[Proc] = []  # fork agents
        self.fork_ledgers: list[str] = []  # SQLite ledgers of a fork family's own
        self.fork_clients: list[tuple[OpenOnce, Payer, Any]] = []  # opened for the drain
        self.reconcilers: dict[str, Proc] = {}
        self.beat: Proc | None = None
        self.redis: Proc | None = None
        self.timers: list[tuple[float, str, Callable[[], None]]] = []
        self.stopped: set[int] = set()
        self.provider = SoakStripe(str(self.out / "provider.jsonl"), idempotency=cfg.idempotency)
        self.proxy: PgProxy | None = None
        self.db_name = ""
        self.direct = ""  # the ledger, for the soak's own reads, the person and the checker
        self.via_proxy = ""  # the ledger, for the agents and the daemon
        self.oo: OpenOnce | None = None
        self.resources: dict[str, dict[str, dict[str, float]]] = {}
        self.connections: list[int] = []
        self.crashes: Counter[str] = Counter()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():7.2f}s] {message}", flush=True)

    # -- set-up --------------------------------------------------------------------------

    def setup(self) -> None:
        self.provider.start()
        env_extra = {
            "OPENONCE_PROBERS": "tests.support.provider_probers:PROBERS",
            "OPENONCE_TEST_STRIPE_URL": self.provider.url,
            "OPENONCE_TEST_STRIPE_KEY": "sk_test_good",
            "OPENONCE_TEST_STRIPE_TIMEOUT": "3",
            "OPENONCE_TEST_STRIPE_RPS": "8",
            "OPENONCE_GRACE_SECONDS": str(self.cfg.grace),
            "OPENONCE_STALE_CALL_GRACE": str(self.cfg.stale_grace),
            "OPENONCE_DEAD_OWNER_GRACE": str(self.cfg.stale_grace),
            "OPENONCE_SWEEP_INTERVAL": "1",
            "OPENONCE_DISPATCH_TTL": "8",
            "OPENONCE_PROBE_TIMEOUT": "5",
            "OPENONCE_PROBE_RETRIES": "2",
            "OPENONCE_LEDGER_POOL_MAX": "3",
            "OPENONCE_NOTIFY_INTERVAL": "2",
            "OPENONCE_STATE_DIR": str(self.out),
            "PGSSLMODE": "disable",
            "PGGSSENCMODE": "disable",
        }
        if self.cfg.store == "postgres":
            self.db_name, self.direct = create_database("oo_soak_")
            migrate(daemon_env(self.direct, **env_extra))
            self.proxy = PgProxy("127.0.0.1", 5432).start()
            self.via_proxy = (
                self.direct.replace("127.0.0.1:5432", f"127.0.0.1:{self.proxy.port}")
                + "?sslmode=disable&gssencmode=disable"
            )
            self.redis_port = free_port()
            self.start_redis()
            broker = f"redis://127.0.0.1:{self.redis_port}/0"
            self.denv = daemon_env(self.via_proxy.split("?")[0], broker, **env_extra)
            self.denv["OPENONCE_DATABASE"] = self.via_proxy.split("?")[0]
            for i in range(self.cfg.workers):
                self.start_reconciler(f"worker-{i}")
            self.beat = start_beat("beat", self.denv, self.logs, loglevel="warning")
            from openonce_core.stores.postgres import PostgresStore

            self.oo = OpenOnce(PostgresStore(self.direct, max_size=3), wait_seconds=3.0)
        else:
            self.direct = self.via_proxy = str(self.out / "ledger.db")
            if self.cfg.reconciler_uid is not None:
                # A reconciler runs as another user: the ledger (and the -wal and -shm files
                # SQLite makes with the database file's mode) and its folder writable by it.
                os.umask(0)
                self.out.chmod(0o777)
                Path(self.direct).touch(0o666)
                Path(self.direct).chmod(0o666)
            self.oo = OpenOnce(self.direct, wait_seconds=3.0)  # installs the ledger schema
            self.denv = daemon_env(self.direct, **env_extra)
            migrate(self.denv)
            for f in self.out.glob("ledger.db*"):
                if self.cfg.reconciler_uid is not None:
                    f.chmod(0o666)
            for i in range(self.cfg.workers):  # two loops: the console's and the daemon's
                self.start_reconciler(f"worker-{i}")
        self.payer = Payer(self.oo, self.provider.url)
        self.t0 = time.monotonic()  # the schedule's and the agents' key window's zero
        for i in range(self.cfg.agents):
            self.start_agent(f"a{i}")

    def start_redis(self) -> None:
        argv = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.out)]  # fmt: skip
        self.redis = spawn("redis", argv, dict(os.environ), self.logs)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.redis_port), 0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("the soak's redis-server did not start")

    def start_reconciler(self, name: str) -> None:
        """A Celery worker (Postgres) or a ``manage.py reconcile --watch`` loop (SQLite),
        run through ``soak_reconciler.py``: its clock follows ``clock-<name>``, and on
        SQLite ``worker-1`` runs as ``reconciler_uid``."""
        if self.cfg.store == "postgres":
            argv = ["-m", "celery", "-A", "openonce_site", "worker", "-l", "warning",
                    "-P", "prefork", "--concurrency", "1",
                    "-n", f"{name}-{os.urandom(3).hex()}@%h",
                    "--without-mingle", "--without-gossip", "--without-heartbeat"]  # fmt: skip
        else:
            argv = [str(REPO / "manage.py"), "reconcile", "--watch", "--interval", "1"]
        uid = self.cfg.reconciler_uid if name == "worker-1" and self.cfg.store == "sqlite" else None
        spec = {"argv": argv, "clock_file": str(self.out / f"clock-{name}"), "uid": uid}
        self.reconcilers[name] = spawn(
            name,
            [PYTHON, str(BENCH / "soak_reconciler.py"), json.dumps(spec)],
            self.denv,
            self.logs,
        )

    def agent_cfg(
        self, name: str, mode: str = "loop", life: float = 0.0, **extra: Any
    ) -> dict[str, Any]:
        return {
            "name": name, "mode": mode, "fork_life": life, "target": self.via_proxy,
            "provider": self.provider.url, "seed": self.cfg.seed, "out": str(self.out),
            "stop_file": str(self.stop_file), "clock_file": str(self.out / f"clock-{name}"),
            "t0": self.t0, "key_rate": self.cfg.key_rate, "window": self.cfg.window,
            "pause": [0.02, 0.15], "lease_seconds": self.cfg.lease,
            "policy": "person" in self.cfg.faults, **extra,
        }  # fmt: skip

    def start_agent(self, name: str, mode: str = "loop", life: float = 0.0, **extra: Any) -> Proc:
        env = {**self.denv, "PYTHONPATH": str(REPO)}
        spec = self.agent_cfg(name, mode, life, **extra)
        argv = [PYTHON, str(BENCH / "soak_agent.py"), json.dumps(spec)]
        proc = spawn(f"agent-{name}", argv, env, self.logs)
        if mode == "loop":
            self.agents[name] = proc
        else:
            self.extras.append(proc)
        return proc

    # -- the nemesis -----------------------------------------------------------------------

    def later(self, seconds: float, what: str, action: Callable[[], None]) -> None:
        self.timers.append((self.elapsed() + seconds, what, action))

    def run_timers(self, everything: bool = False) -> None:
        due = [t for t in self.timers if everything or t[0] <= self.elapsed()]
        self.timers = [t for t in self.timers if t not in due]
        for _, _, action in sorted(due, key=lambda t: t[0]):
            try:
                action()
            except Exception as exc:
                self.notes[f"timer failed: {type(exc).__name__}"] += 1

    def signal_group(self, proc: Proc, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def pause(self, proc: Proc, seconds: float) -> None:
        self.signal_group(proc, signal.SIGSTOP)
        self.stopped.add(proc.pid)

        def resume() -> None:
            self.signal_group(proc, signal.SIGCONT)
            self.stopped.discard(proc.pid)

        self.later(seconds, "cont", resume)

    def apply(self, event: Event) -> None:
        p, kind = event.params, event.kind
        names = sorted(self.agents)
        match kind:
            case "kill_agent":
                # a0 is never killed: the long-lived agent whose resources are compared.
                name = names[1 + p["agent"] % (len(names) - 1)] if len(names) > 1 else names[0]
                self.agents[name].kill9()
                self.later(p["restart_after"], "restart", lambda: self.start_agent(name))
            case "kill_in_flight":
                self.provider.arm("stall", 1, delay=p["delay"])
            case "stop_agent" | "stop_agent_long":
                self.pause(self.agents[names[p["agent"] % len(names)]], p["seconds"])
            case "kill_reconciler" | "stop_reconciler":
                found = sorted(self.reconcilers)
                if kind == "kill_reconciler" and len(found) > 1:
                    found = found[1:]  # worker-0 is never killed: its resources are compared
                name = found[p["worker"] % len(found)]
                proc = self.reconcilers[name]
                if kind == "kill_reconciler":
                    proc.kill9()
                    self.later(p["restart_after"], "restart", lambda: self.start_reconciler(name))
                else:
                    self.pause(proc, p["seconds"])
            case "fork_prefork" | "fork_orphan":
                name = f"{kind[5:]}{self.injected[kind]}"
                extra: dict[str, Any] = {"children": p["children"],
                                         "parent_life": p["parent_life"]}  # fmt: skip
                if p["own_ledger"] and self.cfg.store == "sqlite":
                    # Orders of its own (f-<name>-order-1..12) on a ledger of its own.
                    ledger = self.out / f"fork-{name}.db"
                    self.fork_ledgers.append(str(ledger))
                    extra.update(target=str(ledger), prefix=f"f-{name}-", keys=12)
                self.start_agent(name, kind[5:], p["life"], **extra)
            case "clock_step" | "reconciler_clock_step":
                if kind == "clock_step":
                    name = names[p["agent"] % len(names)]
                else:
                    found = sorted(self.reconcilers)
                    name = found[p["worker"] % len(found)]
                path = self.out / f"clock-{name}"
                path.write_text(str(p["offset"]))
                self.later(p["seconds"], "clock back", lambda: path.write_text("0"))
            case "pg_terminate":
                with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = %s AND pid <> pg_backend_pid()"
                        " AND backend_type = 'client backend' ORDER BY random() LIMIT %s",
                        (self.db_name, p["backends"]),
                    )
            case "proxy_drop_commit":
                assert self.proxy is not None
                self.proxy.drop_after_commit(p["replies"])
            case "proxy_delay":
                assert self.proxy is not None
                self.proxy.delay(p["delay"], p["seconds"])
            case "redis_restart":
                assert self.redis is not None
                self.redis.kill9()
                self.later(p["down"], "redis back", self.start_redis)
            case "provider_lost_reply":
                self.provider.arm("lost_reply", p["requests"])
            case "provider_no_answer":
                self.provider.arm("no_answer", p["requests"], execute=p["executed"])
            case "provider_429":
                self.provider.arm("429", p["requests"])
            case "provider_5xx":
                self.provider.arm("500_after" if p["after_executing"] else "503", p["requests"])
            case "provider_slow" | "provider_stall":
                self.provider.arm("slow", p["requests"], delay=p["delay"])
            case "probe_errors":
                headers = {"Retry-After": "1"} if p["status"] == 429 else {}
                self.provider.fail_next(p["status"], count=p["requests"], headers=headers,
                                        body={"error": {"message": "soak"}})  # fmt: skip
            case "person":
                self.person(p["pick"])
        self.injected[kind] += 1

    def person(self, pick: float, resolve: bool = True) -> None:
        """One look at the queue: approve what waits; resolve one unresolved effect on the
        provider's evidence (not during the drain: the reconciler must drain on its own)."""
        assert self.oo is not None
        oo = self.oo
        for effect in oo.store.list_effects([S.REQUIRES_APPROVAL], 20):
            try:
                oo.approve(effect.id, by="soak-person", reason="looked fine",
                           expected_fence=effect.fence)  # fmt: skip
                self.person_did["approve"] += 1
            except OpenOnceError as exc:
                self.person_did[f"refused {type(exc).__name__}"] += 1
        waiting = oo.store.list_effects([S.UNKNOWN, S.HUMAN_REVIEW], 50)
        if not waiting or not resolve:
            return
        effect = waiting[int(pick * len(waiting)) % len(waiting)]
        obj, running = self.provider.lookup(effect.provider_key)
        try:
            if obj is not None:
                receipt = {k: obj[k] for k in ("amount", "currency", "status")}
                oo.resolve_happened(effect.id, receipt={"stripe_id": obj["id"], **receipt},
                                    by="soak-person", reason="found it on the dashboard",
                                    expected_fence=effect.fence)  # fmt: skip
                self.person_did["resolve_happened"] += 1
            elif not running:
                oo.resolve_not_happened(effect.id, by="soak-person",
                                        reason="no such payment on the dashboard",
                                        expected_fence=effect.fence)  # fmt: skip
                self.person_did["resolve_not_happened"] += 1
            else:
                self.person_did["left alone (being processed)"] += 1
        except OpenOnceError as exc:
            self.person_did[f"refused {type(exc).__name__}"] += 1

    def kill_stalled(self) -> None:
        """The caller of a stalled request (its lease owner's pid) is killed at once."""
        assert self.oo is not None
        while self.provider.stalled:
            effect_id = self.provider.stalled.popleft()
            effect = self.oo.store.get(effect_id)
            owner = (effect.lease_owner or "") if effect is not None else ""
            parts = owner.rsplit(":", 2)
            pid = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else 0
            for name, proc in list(self.agents.items()):
                if pid and (proc.pid == pid or pid in children_of(proc.pid)):
                    proc.kill9()
                    self.notes["kill_in_flight: caller killed"] += 1
                    self.later(0.5, "restart", lambda name=name: self.start_agent(name))
                    break
            else:
                with contextlib.suppress(ProcessLookupError):
                    if pid:
                        os.kill(pid, signal.SIGKILL)  # a fork child
                        self.notes["kill_in_flight: caller killed"] += 1

    def watch_processes(self) -> None:
        """An agent or reconciler that died without the nemesis is restarted (and counted)."""
        for name, proc in list(self.agents.items()):
            if not proc.alive() and proc.popen.returncode not in (-9,):
                self.crashes[f"agent exited {proc.popen.returncode}"] += 1
                self.start_agent(name)
        for name, proc in list(self.reconcilers.items()):
            if not proc.alive() and proc.popen.returncode not in (-9,):
                self.crashes[f"{name} exited {proc.popen.returncode}"] += 1
                self.start_reconciler(name)
        if self.beat is not None and not self.beat.alive():
            self.crashes[f"beat exited {self.beat.popen.returncode}"] += 1
            self.beat = start_beat("beat", self.denv, self.logs, loglevel="warning")

    def calm(self) -> None:
        self.run_timers(everything=True)
        self.provider.calm()
        if self.proxy is not None:
            self.proxy.calm()
        for f in self.out.glob("clock-*"):
            f.write_text("0")

    # -- resources ---------------------------------------------------------------------------

    def sample(self, label: str) -> None:
        found: dict[str, dict[str, float]] = {}
        procs = {**{f"agent-{k}": v for k, v in self.agents.items()}, **self.reconcilers}
        if self.beat is not None:
            procs["beat"] = self.beat
        for name, proc in procs.items():
            if proc.alive() and (f := figures(proc.pid)) is not None:
                found[name] = f
                for i, child in enumerate(children_of(proc.pid)):
                    if (c := figures(child)) is not None:
                        found[f"{name}/child{i}"] = c
        if (me := figures(os.getpid())) is not None:
            found["soak (provider, proxy, person)"] = me
        self.resources[label] = found
        if self.db_name:
            with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.db_name,)
                ).fetchone()
            self.connections.append(int(row[0]) if row else 0)

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.cfg
        plan = schedule(cfg)
        (self.out / "schedule.txt").write_text("".join(f"{e}\n" for e in plan))
        print(f"nemesis soak: store={cfg.store} seed={cfg.seed} duration={cfg.duration:g}s"
              f" agents={cfg.agents} out={self.out}")  # fmt: skip
        print(f"faults: {', '.join(k for k in cfg.faults if cfg.store in KINDS[k][0]) or 'none'}")
        if cfg.store == "sqlite" and cfg.reconciler_uid is not None:
            print(f"reconciler worker-1 runs as uid {cfg.reconciler_uid} (the agents as"
                  f" uid {os.geteuid()}): their /proc/<pid>/ns/pid reads EACCES")  # fmt: skip
        print(f"schedule ({len(plan)} events, also in {self.out / 'schedule.txt'}):")
        for e in plan[:200]:
            print("  " + str(e))
        if len(plan) > 200:
            print(f"  ... {len(plan) - 200} more")
        sys.stdout.flush()
        self.setup()
        self.log("set up; faults start")
        sampled = False
        pending = list(plan)
        while self.elapsed() < cfg.duration:
            if not sampled and self.elapsed() >= min(15.0, cfg.duration * 0.15):
                self.sample("start")
                sampled = True
            while pending and pending[0].at <= self.elapsed():
                event = pending.pop(0)
                try:
                    self.apply(event)
                except Exception as exc:
                    self.notes[f"{event.kind} failed: {type(exc).__name__}: {exc}"[:160]] += 1
            self.run_timers()
            self.kill_stalled()
            self.watch_processes()
            time.sleep(0.05)
        self.log("faults stop; settling")
        self.calm()
        time.sleep(3.0)
        self.watch_processes()
        self.sample("end")
        drained = self.drain()
        return self.finish(drained)

    def drain(self) -> bool:
        """Stop the agents; call every re-armed or approved order once more; let the
        reconciler resolve the rest. True when nothing is left in flight."""
        assert self.oo is not None
        self.stop_file.touch()
        for proc in [*self.agents.values(), *self.extras]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)
            proc.stop(grace=2)
        record = (self.out / "agent-drain.jsonl").open("a", encoding="utf-8")
        deadline = time.monotonic() + self.cfg.drain
        open_states = [S.PLANNED, S.APPROVED, S.STARTED, S.UNKNOWN]
        self.fork_clients = [self.open_fork_ledger(path) for path in self.fork_ledgers]
        ledgers = [(self.oo, self.payer, None), *self.fork_clients]
        while True:
            if "person" in self.cfg.faults:
                self.person(0.0, resolve=False)
            left = []
            for oo, payer, reconciler in ledgers:
                if reconciler is not None:  # a fork family's ledger: reconciled here
                    try:
                        reconciler.run_once()
                    except Exception as exc:
                        self.notes[f"fork ledger reconcile: {type(exc).__name__}"] += 1
                found = oo.store.list_effects(open_states, 10_000)
                left += found
                for effect in found:
                    if effect.state in (S.PLANNED, S.APPROVED) and time.monotonic() < deadline:
                        line = payer.call(effect.args["order"])
                        record.write(json.dumps({**line, "drain": True}, sort_keys=True) + "\n")
                        record.flush()
            if not left:
                self.log("drained")
                return True
            if time.monotonic() > deadline:
                self.log(f"drain timed out with {len(left)} effects open")
                return False
            time.sleep(1.0)

    def open_fork_ledger(self, path: str) -> tuple[OpenOnce, Payer, Any]:
        """A fork family's own ledger, for the drain: a client, and the core's Reconciler
        built as ``manage.py reconcile`` builds it (same probers and grace windows)."""
        from openonce_core._wiring import build_reconciler

        for key in ("OPENONCE_TEST_STRIPE_URL", "OPENONCE_TEST_STRIPE_KEY",
                    "OPENONCE_TEST_STRIPE_TIMEOUT", "OPENONCE_TEST_STRIPE_RPS"):  # fmt: skip
            os.environ[key] = self.denv[key]
        oo = OpenOnce(path, wait_seconds=3.0)
        options: dict[str, Any] = {
            "grace_seconds": self.cfg.grace, "stale_call_grace": self.cfg.stale_grace,
            "dead_owner_grace": self.cfg.stale_grace, "probe_timeout": 5.0,
            "probe_retries": 2, "owner": "soak-drain",
        }  # fmt: skip
        reconciler = build_reconciler(
            oo, probers="tests.support.provider_probers:PROBERS", **options
        )
        return oo, Payer(oo, self.provider.url), reconciler

    # -- the verdict -------------------------------------------------------------------------

    def gather(
        self,
    ) -> tuple[
        list[dict[str, Any]],
        list[dict[str, Any]],
        list[dict[str, Any]],
        dict[str, list[dict[str, Any]]],
    ]:
        assert self.oo is not None
        provider = read_record(str(self.out / "provider.jsonl"))
        agents: list[dict[str, Any]] = []
        for path in sorted(self.out.glob("agent-*.jsonl")):
            with path.open(encoding="utf-8") as f:
                for raw in f:
                    with contextlib.suppress(ValueError):
                        agents.append(json.loads(raw))
        effects = []
        journals: dict[str, list[dict[str, Any]]] = {}
        for oo in [self.oo, *(c[0] for c in self.fork_clients)]:
            for e in oo.store.list_effects(None, 1_000_000):
                effects.append({
                    "id": e.id, "order": e.args.get("order"), "state": str(e.state),
                    "result": e.result, "provider_key": e.provider_key,
                    "updated_at": e.updated_at,
                })  # fmt: skip
                journals[e.id] = [
                    {"action": j.action, "from_state": j.from_state, "to_state": j.to_state,
                     "actor": j.actor, "reason": j.reason, "at": j.at, "evidence": j.evidence}
                    for j in oo.store.journal(e.id)
                ]  # fmt: skip
        return provider, agents, effects, journals

    def finish(self, drained: bool) -> int:
        provider, agents, effects, journals = self.gather()
        # leases.unrenewed_span of the agents' lease: 1.5 renew intervals (a third of it).
        verdict = check(provider, agents, effects, journals,
                        unrenewed_span=1.5 * min(self.cfg.lease / 3, 60.0))  # fmt: skip
        bound = 4 * (self.cfg.agents + 6) + 12 * self.cfg.workers + 12
        check_resources(
            verdict, self.resources.get("start", {}), self.resources.get("end", {}),
            connections=tuple(self.connections[:2]) if len(self.connections) >= 2 else None,  # type: ignore[arg-type]
            connection_bound=bound if self.db_name else 0,
        )  # fmt: skip
        self.report(verdict, provider, agents, effects, journals, drained)
        return 0 if verdict.ok else 1

    def report(
        self, verdict: Verdict, provider: list[dict[str, Any]], agents: list[dict[str, Any]],
        effects: list[dict[str, Any]], journals: dict[str, list[dict[str, Any]]], drained: bool,
    ) -> None:  # fmt: skip
        cfg = self.cfg
        print()
        print(f"=== nemesis soak report: store={cfg.store} seed={cfg.seed}"
              f" duration={cfg.duration:g}s ===")  # fmt: skip
        print("faults injected:")
        for kind in KINDS:
            if self.injected[kind]:
                print(f"  {kind:<22} {self.injected[kind]}")
        served = self.provider.faults_served
        if served:
            print(
                "  provider faults served: "
                + ", ".join(f"{k} {v}" for k, v in sorted(served.items()))
            )
        if self.proxy is not None:
            print("  proxy: " + ", ".join(f"{k} {v}" for k, v in sorted(self.proxy.counts.items())))
        if self.person_did:
            print("  person: " + ", ".join(f"{k} {v}" for k, v in sorted(self.person_did.items())))
        outcomes = Counter(str(a.get("o")) for a in agents)
        ran = sum(1 for a in agents if a.get("o") == "ok" and a.get("ran"))
        kinds = Counter(str(p.get("kind")) for p in provider)
        print("calls:")
        print(
            f"  agent calls {len(agents)}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        )
        print(
            f"  handler ran and returned {ran}; replays (ok without running) {outcomes['ok'] - ran}"
        )
        print(
            f"  provider requests {len(provider)}: "
            + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        )
        paid = {p.get("order") for p in provider if p.get("kind") == "exec"}
        print(f"  provider executions {kinds['exec']} (orders {len(paid)});"
              f" backstop replays {kinds['replay']}")  # fmt: skip
        errors = Counter(str(a.get("e", "")).split(":")[0] for a in agents if a.get("o") == "error")
        if errors:
            print("  agent errors: " + ", ".join(f"{k} {v}" for k, v in errors.most_common()))
        if self.crashes:
            print(
                "  processes that died on their own: "
                + ", ".join(f"{k} {v}" for k, v in self.crashes.items())
            )
        for note, n in self.notes.items():
            print(f"  note: {note} x{n}")
        states = Counter(e["state"] for e in effects)
        actions = Counter(j["action"] for lines in journals.values() for j in lines)
        print(
            f"final states ({len(effects)} effects): "
            + ", ".join(f"{k} {v}" for k, v in states.most_common())
        )
        print("journal moves: " + ", ".join(f"{k} {v}" for k, v in actions.most_common()))
        print(f"drain: {'complete' if drained else 'TIMED OUT'}")
        print("invariants:")
        for name in INVARIANTS:
            bad = verdict.count(name)
            mark = "OK  " if not bad else "FAIL"
            print(f"  {name:<16} {mark} checked {verdict.checked[name]:>6}, violations {bad}")
        for figure, n in verdict.figures.items():
            print(f"  figure: {figure}: {n}")
        print("resources (start -> end; long-lived processes):")
        start, end = self.resources.get("start", {}), self.resources.get("end", {})
        for name in sorted(set(start) | set(end)):
            a, b = start.get(name), end.get(name)
            if a and b and a["pid"] == b["pid"]:
                print(
                    f"  {name:<32} fds {a['fds']:.0f} -> {b['fds']:.0f},"
                    f" threads {a['threads']:.0f} -> {b['threads']:.0f},"
                    f" RSS {a['rss_mb']:.0f} -> {b['rss_mb']:.0f} MB"
                )
        if self.connections:
            seen = " -> ".join(map(str, self.connections))
            print(f"  postgres connections to the soak database: {seen}")
        if verdict.ok:
            print(f"RESULT: PASS (seed {cfg.seed})")
            return
        print(f"RESULT: FAIL — {len(verdict.violations)} violation(s); replay with"
              f" `bench/soak.py --store {cfg.store} --seed {cfg.seed} --duration {cfg.duration:g}"
              f" --faults {','.join(cfg.faults)}"
            f"{'' if cfg.idempotency else ' --no-provider-idempotency'}`")  # fmt: skip
        for v in verdict.violations[:20]:
            print(f"  {v}")
        first = next((v for v in verdict.violations if v.effect_id), None)
        if first is not None:
            print(f"journal of {first.effect_id} ({first.order}), the first violation:")
            for j in journals.get(first.effect_id, []):
                print(f"  {j['at']:.3f} {j['action']:<20} {j['from_state']} -> {j['to_state']}"
                      f"  {j['actor']}: {j['reason']}"[:300])  # fmt: skip
            print(f"provider's record of {first.order}:")
            for p in provider:
                if p.get("order") == first.order:
                    print(f"  {json.dumps(p, sort_keys=True)}")
            print(f"agents' calls of {first.order} (last 15):")
            for a in [a for a in agents if a.get("k") == first.order][-15:]:
                print(f"  {json.dumps(a, sort_keys=True)}")
        print(f"logs and records: {self.out}")

    # -- tear-down -----------------------------------------------------------------------------

    def close(self) -> None:
        self.stop_file.touch()
        for proc in [*self.agents.values(), *self.extras, *self.reconcilers.values()]:
            self.signal_group(proc, signal.SIGCONT)
            proc.stop(grace=3)
        if self.beat is not None:
            self.beat.stop(grace=3)
        if self.redis is not None:
            self.redis.kill9()
        for oo in [self.oo, *(c[0] for c in self.fork_clients)]:
            if oo is not None:
                with contextlib.suppress(Exception):
                    oo.close()
        if self.proxy is not None:
            self.proxy.stop()
        self.provider.stop()
        if self.db_name and not self.cfg.keep:
            with contextlib.suppress(Exception):
                drop_database(self.db_name)


def run(cfg: Config) -> int:
    soak = Soak(cfg)
    try:
        return soak.run()
    finally:
        soak.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--store", choices=("sqlite", "postgres", "both"), default="sqlite")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--faults", default="default",
                    help="comma list of kinds or groups (" + ", ".join(GROUPS) + "), 'all',"
                    " 'none', or '-group' to remove one from the default")  # fmt: skip
    ap.add_argument("--drain", type=float, default=100.0, help="longest wait for the drain (s)")
    ap.add_argument("--out", default="", help="where records and logs go (default: a temp dir)")
    ap.add_argument("--no-provider-idempotency", action="store_true",
                    help="the provider executes every request (no Stripe backstop)")  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep the Postgres database")
    ap.add_argument("--reconciler-uid", default="auto",
                    help="SQLite: run reconciler worker-1 as this uid ('auto': 65534 when run"
                    " as root, else nobody else; 'none': as the soak's user)")  # fmt: skip
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    stores = ("sqlite", "postgres") if args.store == "both" else (args.store,)
    code = 0
    if args.reconciler_uid == "auto":
        other_uid = 65534 if os.geteuid() == 0 else None
    else:
        other_uid = None if args.reconciler_uid == "none" else int(args.reconciler_uid)
    for store in stores:
        out = str(Path(args.out) / store) if args.out else ""
        cfg = Config(
            duration=args.duration, seed=args.seed, store=store, agents=args.agents,
            faults=parse_faults(args.faults), out=out, drain=args.drain,
            idempotency=not args.no_provider_idempotency, keep=args.keep,
            reconciler_uid=other_uid,
        )  # fmt: skip
        code |= run(cfg)
    return code


if __name__ == "__main__":
    sys.exit(main())
