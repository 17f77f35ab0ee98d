"""The reconciler daemon (Celery beat + workers) draining a backlog of UNKNOWN effects.

End to end, as production runs it, on this machine:

* a fresh Postgres database (``CREATE DATABASE``), migrated by ``manage.py migrate`` in a
  subprocess with ``OPENONCE_DATABASE`` pointing at it;
* ``N`` effects (10,000 by default) left UNKNOWN through OpenOnce itself (a
  ``stripe.charge`` handler raising ``TimeoutError``), as ``bench/reconcile.py`` makes them;
* Celery workers (two processes with ``--concurrency 1`` by default, or one with
  ``--concurrency 2``) and one beat, on an empty Redis database, with
  ``OPENONCE_PROBERS=tests.support.probers:PROBERS`` (an instant prober deciding from the
  effect's args: every order here is "paid-*", so HAPPENED with a bound receipt),
  ``OPENONCE_GRACE_SECONDS=0`` and ``OPENONCE_SWEEP_INTERVAL=1``.

The clock starts when beat is started (the workers are up and idle by then) and stops when
every effect is committed, polled every 0.5 s; the journal's last commit time gives the
same end without the polling granularity. Probes resolved per second are compared with the
budget of 300/s. Afterwards the journal must hold exactly one line into ``committed`` per
effect. Every process is stopped, the Redis database flushed and the Postgres database
dropped at the end, whatever happened. Usage::

    python bench/daemon.py [--effects N] [--workers two|one] [--sweep-limit L]
                           [--sweep-batch B] [--pg-dsn DSN] [--redis URL] [--json]
    python bench/daemon.py --rate-limited [--provider-limit 20] [--effects 1000]

``--rate-limited`` drains against a Stripe-like server on a local socket
(tests/support/fake_stripe.py) that answers 429 above ``--provider-limit`` requests in any
second, probed by the real ``StripeProber`` and its HTTP client, each worker process
limited to its share of 90% of that limit. It reports probes/s, requests/s at the
provider, the busiest second and the 429s beside the provider's limit, and the time to
drain.

The Postgres DSN (a database to connect to for ``CREATE DATABASE``) defaults to
``$OPENONCE_BENCH_PG``, then to ``postgresql://root@127.0.0.1:5432/test``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hotpath import code_revision, say
from reconcile import CREATE_THREADS, create_unknown, verify

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELERY = os.path.join(os.path.dirname(sys.executable), "celery")
DEFAULT_PG = "postgresql://root@127.0.0.1:5432/test"
BUDGET = 300.0  # probes resolved per second, from the issue
POLL = 0.5
SWEEP_INTERVAL = 1


@dataclass
class Outcome:
    effects: int
    workers: str
    sweep_limit: int
    sweep_batch: int
    redis_db: int
    created_per_s: float = 0.0
    migrate_s: float = 0.0
    drain_s: float = 0.0  # beat start -> the poll that saw every effect committed
    last_commit_s: float = 0.0  # beat start -> the journal's last line into committed
    first_commit_s: float = 0.0  # beat start -> the first one
    polls: list[tuple[float, int]] = field(default_factory=list)  # (s since beat, committed)
    sweeps: dict[str, int] = field(default_factory=dict)
    checks: dict[str, dict[str, int]] = field(default_factory=dict)
    provider_limit: int = 0  # --rate-limited: the fake provider's requests per second
    provider: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.effects / self.drain_s

    @property
    def journal_rate(self) -> float:
        return self.effects / self.last_commit_s

    @property
    def steady_rate(self) -> float:
        span = self.last_commit_s - self.first_commit_s
        return self.effects / span if span > 0 else float("inf")

    @property
    def verdict(self) -> str:
        if self.provider_limit:
            ok = self.provider["peak_per_s"] <= self.provider_limit and not self.provider["429s"]
            return "PASS" if ok else "OVER"
        return "PASS" if self.rate >= BUDGET else "BELOW"

    def as_dict(self) -> dict[str, Any]:
        doc = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        doc.update(
            probes_per_s=round(self.rate, 1),
            probes_per_s_journal=round(self.journal_rate, 1),
            steady_probes_per_s=round(self.steady_rate, 1),
            budget=BUDGET,
            verdict=self.verdict,
        )
        doc["polls"] = [[round(t, 2), n] for t, n in self.polls]
        return doc


# -- Postgres and Redis scratch space -------------------------------------------------------


def database_url(admin_dsn: str, dbname: str) -> str:
    """A postgresql:// URL (what OPENONCE_DATABASE takes) for ``dbname`` on the same
    server, as the same user, as ``admin_dsn``."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(admin_dsn)
    user = quote(str(info.get("user") or ""), safe="")
    password = quote(str(info.get("password") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(info.get("host") or "127.0.0.1")
    port = str(info.get("port") or "5432")
    return f"postgresql://{auth}{host}:{port}/{dbname}"


def free_redis_db(client: Any, wanted: int | None) -> int:
    """An empty Redis database (highest number first), or the one asked for."""
    if wanted is not None:
        return wanted
    count = int(client.config_get("databases").get("databases", 16))
    used = {int(name[2:]) for name in client.info("keyspace")}
    for number in range(count - 1, 0, -1):
        if number not in used:
            return number
    raise RuntimeError("no empty Redis database; pass --redis-db")


# -- processes ------------------------------------------------------------------------------


class Processes:
    """The Celery processes this script starts, each in a process group of its own so it
    (and its pool children) can be stopped by that id and nothing else."""

    def __init__(self, workdir: str, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.started: list[tuple[str, subprocess.Popen[bytes], TextIO]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.workdir, f"{name}.log"), "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [CELERY, "-A", "openonce_site", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started.append((name, proc, log))
        return proc

    def log(self, name: str) -> str:
        with open(os.path.join(self.workdir, f"{name}.log")) as fh:
            return fh.read()

    def wait_ready(self, names: list[str], timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        for name in names:
            while " ready." not in self.log(name):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not ready after {timeout:.0f} s:\n{self.log(name)}")
                time.sleep(0.2)

    def check_alive(self) -> None:
        for name, proc, _ in self.started:
            if proc.poll() is not None:
                tail = self.log(name)[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def stop_all(self) -> None:
        """Beat first, then the workers: SIGTERM to each group, SIGKILL after 15 s."""
        for _, proc, _ in reversed(self.started):
            if proc.poll() is None:
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc, _ in reversed(self.started):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for _, proc, log in self.started:
            _signal_group(proc, signal.SIGKILL)  # pool children left behind, if any
            if proc.poll() is None:
                proc.wait(timeout=10)
            log.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)  # the group this script created for this process


# -- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace, settings: dict[str, Any]) -> Outcome:
    import psycopg
    import redis
    from psycopg.conninfo import make_conninfo

    from openonce_core import OpenOnce
    from openonce_core.stores.postgres import PostgresStore

    dbname = "openonce_bench_" + uuid.uuid4().hex[:10]
    url = database_url(args.pg_dsn, dbname)
    dsn = make_conninfo(args.pg_dsn, dbname=dbname)
    broker = redis.Redis.from_url(args.redis)
    redis_db = free_redis_db(broker, args.redis_db)
    broker_url = f"{args.redis.rstrip('/')}/{redis_db}"
    workdir = tempfile.mkdtemp(prefix="openonce-daemon-bench-")
    fake = None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENONCE_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="openonce_site.settings.test",
        OPENONCE_DATABASE=url,
        OPENONCE_BROKER_URL=broker_url,
        OPENONCE_PROBERS="tests.support.probers:PROBERS",
        OPENONCE_GRACE_SECONDS="0",
        OPENONCE_SWEEP_INTERVAL=str(SWEEP_INTERVAL),
        OPENONCE_SWEEP_LIMIT=str(args.sweep_limit),
        OPENONCE_SWEEP_BATCH=str(args.sweep_batch),
        PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p),
    )
    outcome = Outcome(args.effects, args.workers, args.sweep_limit, args.sweep_batch, redis_db)
    if args.rate_limited:
        from tests.support.fake_stripe import FakeStripeServer

        fake = FakeStripeServer().start()
        fake.rate_limit = args.provider_limit
        outcome.provider_limit = args.provider_limit
        # Two worker processes either way; each gets its share of 90% of the limit (a
        # margin for the jitter of requests in flight).
        env.update(
            OPENONCE_PROBERS="tests.support.provider_probers:PROBERS",
            OPENONCE_TEST_STRIPE_URL=fake.url,
            OPENONCE_TEST_STRIPE_KEY="sk_test_good",
            OPENONCE_TEST_STRIPE_RPS=str(0.9 * args.provider_limit / 2),
        )
    procs = Processes(workdir, env)
    created_db = False
    with psycopg.connect(args.pg_dsn, autocommit=True) as admin:
        settings["postgres"] = {
            name: str(admin.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in ("server_version", "synchronous_commit", "fsync")
        }
    try:
        with psycopg.connect(args.pg_dsn, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {dbname}")
            created_db = True
        say(f"database {dbname}: manage.py migrate ...")
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"migrate failed:\n{done.stdout}\n{done.stderr}")
        outcome.migrate_s = time.perf_counter() - start

        say(f"creating {args.effects:,} UNKNOWN effects through OpenOnce ...")
        oo = OpenOnce(PostgresStore(dsn), migrate=False)
        try:
            outcome.created_per_s = create_unknown(oo, args.effects, CREATE_THREADS["postgres"])
        finally:
            oo.close()
        if fake is not None:
            with psycopg.connect(dsn) as conn:
                for effect_id, key in conn.execute(
                    "SELECT id, provider_key FROM openonce_effects"
                ).fetchall():
                    fake.add("payment_intents", key, effect_id=effect_id)

        redis_client = redis.Redis.from_url(broker_url)
        redis_client.flushdb()
        say(f"redis db {redis_db} flushed; starting workers ({args.workers}) ...")
        if args.workers == "two":
            names = ["worker1", "worker2"]
            for name in names:
                procs.start(name, _worker_args(name, 1))
        else:
            names = ["worker"]
            procs.start("worker", _worker_args("worker", 2))
        procs.wait_ready(names)

        say("workers ready; starting beat, clock running ...")
        with psycopg.connect(dsn, autocommit=True) as conn:
            started_wall = time.time()
            started = time.monotonic()
            procs.start(
                "beat",
                ["beat", "-l", "INFO", "-s", os.path.join(workdir, "beat-schedule")],
            )
            committed = 0
            while committed < args.effects:
                time.sleep(POLL)
                procs.check_alive()
                states: dict[str, int] = dict(
                    conn.execute(
                        "SELECT state, count(*) FROM openonce_effects GROUP BY state"
                    ).fetchall()
                )
                committed = states.get("committed", 0)
                elapsed = time.monotonic() - started
                outcome.polls.append((elapsed, committed))
                stray = {s: n for s, n in states.items() if s not in ("unknown", "committed")}
                if stray:
                    raise AssertionError(f"effects left the unknown->committed path: {stray}")
                if elapsed > args.timeout:
                    raise RuntimeError(f"not drained after {args.timeout:.0f} s: {states}")
                say(f"  {elapsed:6.1f} s: {committed:,}/{args.effects:,} committed")
            outcome.drain_s = time.monotonic() - started
            if fake is not None:
                requests = len(fake.seen())
                outcome.provider = {
                    "requests": requests,
                    "requests_per_s": requests / outcome.drain_s,
                    "peak_per_s": fake.max_in_window(1.0),
                    "429s": fake.statuses().get(429, 0),
                }
            first, last = conn.execute(
                "SELECT min(at), max(at) FROM openonce_journal WHERE to_state = 'committed'"
            ).fetchone()  # type: ignore[misc]
            outcome.first_commit_s = first - started_wall
            outcome.last_commit_s = last - started_wall
            procs.stop_all()  # nothing more to do; stops ticks before the counts are read
            outcome.checks = verify(
                "postgres",
                lambda q: conn.execute(q).fetchone()[0],  # type: ignore[index]
                args.effects,
                sides=(("daemon", "openonce_effects", "openonce_journal"),),
            )
            row = conn.execute(
                "SELECT count(*), count(*) FILTER (WHERE due > 0), coalesce(sum(due), 0),"
                " coalesce(sum(batches), 0), coalesce(sum(batches_done), 0),"
                " coalesce(sum(committed), 0), coalesce(sum(lost_races), 0),"
                " coalesce(sum(probes_happened), 0), coalesce(sum(escalated), 0)"
                " FROM reconciler_sweep"
            ).fetchone()
            names_ = (
                "sweeps", "sweeps with work", "due selected", "batches", "batches done",
                "committed", "lost races", "probes", "escalated",
            )  # fmt: skip
            outcome.sweeps = dict(zip(names_, map(int, row or ()), strict=True))
        return outcome
    finally:
        procs.stop_all()
        if fake is not None:
            fake.stop()
        try:
            redis.Redis.from_url(broker_url).flushdb()
        except redis.RedisError as exc:
            say(f"WARNING: could not flush redis db {redis_db}: {exc}")
        if created_db:
            with psycopg.connect(args.pg_dsn, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        if args.keep_logs:
            say(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _worker_args(name: str, concurrency: int) -> list[str]:
    return [
        "worker",
        "--concurrency",
        str(concurrency),
        "-n",
        f"{name}-bench-{os.getpid()}@%h",
        "-l",
        "INFO",
    ]


# -- report ---------------------------------------------------------------------------------


def render(o: Outcome, settings: dict[str, Any], notes: list[str]) -> str:
    p = settings["postgres"]
    workers = (
        "2 worker processes x --concurrency 1 (prefork)"
        if o.workers == "two"
        else "1 worker x --concurrency 2 (prefork)"
    )
    if o.provider_limit:
        return _render_rate_limited(o, settings, workers, notes)
    out = [
        "OpenOnce reconciler daemon (Celery beat + workers) draining a backlog of due UNKNOWN"
        " effects, from beat start",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {settings['revision']}",
        f"postgres {p['server_version']}: synchronous_commit={p['synchronous_commit']},"
        f" fsync={p['fsync']}; redis db {o.redis_db} (flushed before and after)",
        f"celery: {workers} + 1 beat; OPENONCE_SWEEP_INTERVAL={SWEEP_INTERVAL},"
        f" OPENONCE_SWEEP_LIMIT={o.sweep_limit}, OPENONCE_SWEEP_BATCH={o.sweep_batch},"
        " OPENONCE_GRACE_SECONDS=0, prober tests.support.probers (instant)",
        "",
    ]
    header = (
        f"{'effects':>8}{'drain s':>9}{'probes/s':>10}{'budget':>8}  verdict"
        f"{'last commit s':>15}{'probes/s':>10}{'first commit s':>16}{'steady/s':>10}"
    )
    out += [header, "-" * len(header)]
    out.append(
        f"{o.effects:>8,}{o.drain_s:>9.2f}{o.rate:>10,.0f}{'>=' + format(BUDGET, '.0f'):>8}"
        f"  {o.verdict:<7}{o.last_commit_s:>15.2f}{o.journal_rate:>10,.0f}"
        f"{o.first_commit_s:>16.2f}{o.steady_rate:>10,.0f}"
    )
    out += [
        "drain s: beat start -> the poll (every 0.5 s) that saw all committed; probes/s ="
        " effects / drain s, the figure held to the budget;",
        "last/first commit s: beat start -> the journal's last/first line into committed"
        " (no polling granularity); steady/s = effects / (last - first commit)",
        "",
        "committed by time since beat start: "
        + ", ".join(f"{t:.1f}s {n:,}" for t, n in _thinned(o.polls)),
        "",
        "sweeps (reconciler_sweep): " + "; ".join(f"{k} {v:,}" for k, v in o.sweeps.items()),
        f"redundant probes (probes - effects): {o.sweeps.get('probes', 0) - o.effects:,}",
        "",
        "exactly once, from the ledger and its journal:",
        "  " + "; ".join(f"{k} {v:,}" for k, v in o.checks["daemon"].items()),
        f"setup (not timed): manage.py migrate {o.migrate_s:.1f} s; backlog created through"
        f" OpenOnce at {o.created_per_s:,.0f} effects/s",
    ]
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def _render_rate_limited(
    o: Outcome, settings: dict[str, Any], workers: str, notes: list[str]
) -> str:
    pv = o.provider
    out = [
        "OpenOnce reconciler daemon draining a backlog against a rate-limited Stripe-like API"
        " (real StripeProber over HTTP, 429 above the limit)",
        f"machine: {os.cpu_count()} cores, {platform.system()} {platform.release()},"
        f" Python {platform.python_version()}; code: {settings['revision']}",
        f"celery: {workers} + 1 beat; each process limited to"
        f" {0.9 * o.provider_limit / 2:g} requests/s (90% of the limit, shared out)",
        "",
    ]
    header = (
        f"{'effects':>8}{'drain s':>9}{'probes/s':>10}{'req/s':>8}{'peak 1s':>9}"
        f"{'limit/s':>9}{'429s':>6}  verdict"
    )
    out += [header, "-" * len(header)]
    out.append(
        f"{o.effects:>8,}{o.drain_s:>9.2f}{o.rate:>10.1f}{pv['requests_per_s']:>8.1f}"
        f"{pv['peak_per_s']:>9.0f}{o.provider_limit:>9}{pv['429s']:>6.0f}  {o.verdict}"
    )
    out += [
        "probes/s = effects / drain s; req/s = requests the provider saw / drain s; peak 1s ="
        " the most requests in any one second; PASS = peak <= limit and no 429",
        f"requests at the provider: {pv['requests']:,.0f} for {o.effects:,} effects",
        "sweeps (reconciler_sweep): " + "; ".join(f"{k} {v:,}" for k, v in o.sweeps.items()),
        "exactly once: " + "; ".join(f"{k} {v:,}" for k, v in o.checks.get("daemon", {}).items()),
    ]
    out += [f"note: {n}" for n in notes]
    return "\n".join(out)


def _thinned(polls: list[tuple[float, int]], most: int = 12) -> list[tuple[float, int]]:
    step = max(1, -(-len(polls) // most))
    picked = polls[::step]
    if polls and picked[-1] != polls[-1]:
        picked.append(polls[-1])
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--effects", type=int, default=10_000, help="backlog size")
    parser.add_argument(
        "--workers",
        choices=("two", "one"),
        default="two",
        help="two worker processes with --concurrency 1 (default), or one with 2",
    )
    parser.add_argument("--sweep-limit", type=int, default=5000, help="OPENONCE_SWEEP_LIMIT")
    parser.add_argument("--sweep-batch", type=int, default=100, help="OPENONCE_SWEEP_BATCH")
    parser.add_argument(
        "--pg-dsn",
        default=os.environ.get("OPENONCE_BENCH_PG") or DEFAULT_PG,
        help="Postgres DSN to run CREATE DATABASE from (default: $OPENONCE_BENCH_PG or"
        f" {DEFAULT_PG})",
    )
    parser.add_argument("--redis", default="redis://127.0.0.1:6379", help="Redis server URL")
    parser.add_argument(
        "--redis-db", type=int, default=None, help="Redis db number (default: an empty one)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after (s)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the Celery logs")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--rate-limited", action="store_true",
        help="probe a local Stripe-like API that answers 429 above --provider-limit",
    )  # fmt: skip
    parser.add_argument(
        "--provider-limit", type=int, default=20, help="the fake provider's requests/s"
    )
    args = parser.parse_args(argv)
    if args.rate_limited and "--effects" not in " ".join(argv or sys.argv):
        args.effects = 1000
    if args.effects < 1 or args.sweep_limit < 1 or args.sweep_batch < 1:
        parser.error("--effects, --sweep-limit and --sweep-batch must be at least 1")

    # A SIGTERM to this script still runs the clean-up (processes, Redis db, database).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    settings: dict[str, Any] = {"revision": code_revision()}
    started = time.monotonic()
    outcome = run(args, settings)
    elapsed = time.monotonic() - started
    if args.json:
        report = {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "settings": settings,
            "result": outcome.as_dict(),
            "seconds": round(elapsed, 1),
        }
        print(json.dumps(report, indent=2))
    else:
        print(render(outcome, settings, [f"took {elapsed:.0f} s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
