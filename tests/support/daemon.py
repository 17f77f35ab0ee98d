"""Helpers for the reconciler daemon tests: fresh ledgers, Redis databases, Celery worker and
beat processes, ``manage.py`` subprocesses and ledger queries.

Every child process is started with ``start_new_session=True`` so it leads its own process
group: ``Proc.stop()`` and ``Proc.kill9()`` signal the whole group (a prefork worker and its
pool children together), and nothing outlives the test that started it.

Also holds probers that fail, for OPENONCE_PROBERS=tests.support.daemon:FAILING_PROBERS.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from openonce_core import OpenOnce, OutcomeUnknownError
from openonce_core._probe import ProbeResult
from openonce_core._records import Effect

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MANAGE = str(REPO / "manage.py")
ADMIN_DSN = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
# Exactly how the machine's Redis is started (CI and other tests rely on it).
REDIS_START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
    "--logfile", "/var/log/redis/ci.log",
]  # fmt: skip


def log(message: str) -> None:
    """Timings and progress, shown with ``pytest -s``."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- Postgres: one fresh database per test ------------------------------------------------


def dsn_for(database: str) -> str:
    parts = urlsplit(ADMIN_DSN)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))


def create_database(prefix: str = "oo_it_") -> tuple[str, str]:
    """CREATE DATABASE <prefix><random>; returns (name, dsn)."""
    name = prefix + uuid.uuid4().hex[:12]
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name, dsn_for(name)


def drop_database(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(prefix: str = "oo_it_") -> Iterator[tuple[str, str]]:
    name, dsn = create_database(prefix)
    try:
        yield name, dsn
    finally:
        drop_database(name)


# -- Redis --------------------------------------------------------------------------------


def redis_client(db: int = 0, timeout: float = 2.0) -> Any:
    import redis

    return redis.Redis(
        host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )  # fmt: skip


def redis_ping() -> bool:
    """``redis-cli ping`` (redis-py retries a refused connection for seconds; this does not)."""
    try:
        done = subprocess.run(
            ["redis-cli", "-h", REDIS_HOST, "-p", str(REDIS_PORT), "ping"],
            capture_output=True, text=True, timeout=5, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.strip() == "PONG"


def pick_redis_db() -> tuple[int, str]:
    """An empty Redis database (1..15, random order), flushed; returns (number, broker url).
    Database 0 is left to whoever else uses this Redis."""
    candidates = list(range(1, 16))
    random.shuffle(candidates)
    chosen = next((n for n in candidates if redis_client(n).dbsize() == 0), candidates[0])
    client = redis_client(chosen)
    client.flushdb()
    client.close()
    return chosen, f"redis://{REDIS_HOST}:{REDIS_PORT}/{chosen}"


def redis_shutdown() -> None:
    subprocess.run(
        ["redis-cli", "-p", str(REDIS_PORT), "shutdown", "nosave"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while redis_ping():
        if time.monotonic() > deadline:
            raise RuntimeError("Redis did not shut down")
        time.sleep(0.05)


def redis_start() -> None:
    """Start the machine's Redis the way it is normally started; wait for PONG."""
    if redis_ping():
        return
    subprocess.run(REDIS_START, capture_output=True, text=True, timeout=20, check=False)
    deadline = time.monotonic() + 20
    while not redis_ping():
        if time.monotonic() > deadline:
            raise RuntimeError("Redis did not come back: " + " ".join(REDIS_START))
        time.sleep(0.05)


# -- environment and subprocesses ---------------------------------------------------------


def daemon_env(dsn: str, broker_url: str = "", **extra: str) -> dict[str, str]:
    """The environment a worker, a beat or ``manage.py`` runs with in these tests."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENONCE_", "CELERY_", "PYTEST_", "DJANGO_"))
    }
    env.update(
        OPENONCE_DATABASE=dsn,
        OPENONCE_PROBERS="tests.support.probers:PROBERS",
        OPENONCE_GRACE_SECONDS="0",
        OPENONCE_SWEEP_INTERVAL="1",
        DJANGO_SETTINGS_MODULE="openonce_site.settings.test",
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
    )
    if broker_url:
        env["OPENONCE_BROKER_URL"] = broker_url
        # The workers share one rate limiter, as deployed, in the stack's own database.
        env["OPENONCE_RATE_LIMIT_REDIS"] = broker_url
    env.update(extra)
    return env


def manage(
    env: dict[str, str], *args: str, timeout: float = 60.0, check: bool = False
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [PYTHON, MANAGE, *args], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    if check and done.returncode != 0:
        raise AssertionError(
            f"manage.py {' '.join(args)} exited {done.returncode}\n"
            f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return done


def migrate(env: dict[str, str]) -> float:
    started = time.monotonic()
    manage(env, "migrate", "--noinput", "-v0", check=True)
    return time.monotonic() - started


@dataclass
class Proc:
    """A child process leading its own process group, output in ``log_path``."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def kill9(self) -> None:
        """SIGKILL the whole process group (worker and pool children) and reap it."""
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL whatever is left after ``grace`` seconds."""
        if self.alive():
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        # Pool children or anything else left in the group goes too.
        self._signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        return self.popen.returncode


def spawn(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as out:
        popen = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    return Proc(name, popen, log_path)


def celery_argv(*args: str) -> list[str]:
    return [PYTHON, "-m", "celery", "-A", "openonce_site", *args]


def start_worker(
    name: str,
    env: dict[str, str],
    log_dir: Path,
    *,
    concurrency: int = 2,
    pool: str = "prefork",
    loglevel: str = "info",
    queues: str = "",
) -> Proc:
    argv = celery_argv(
        "worker", "-l", loglevel, "-P", pool, "--concurrency", str(concurrency),
        "-n", f"{name}-{uuid.uuid4().hex[:6]}@%h",
        "--without-mingle", "--without-gossip", "--without-heartbeat",
    )  # fmt: skip
    if queues:
        argv += ["-Q", queues]
    return spawn(name, argv, env, log_dir)


def start_beat(name: str, env: dict[str, str], log_dir: Path, *, loglevel: str = "info") -> Proc:
    schedule = log_dir / f"{name}-schedule"
    argv = celery_argv("beat", "-l", loglevel, "-s", str(schedule), "--pidfile=")
    return spawn(name, argv, env, log_dir)


def start_manage(name: str, env: dict[str, str], log_dir: Path, *args: str) -> Proc:
    return spawn(name, [PYTHON, MANAGE, *args], env, log_dir)


# -- the ledger ---------------------------------------------------------------------------


class Agent:
    """An agent process's view: a ``stripe.charge`` effect whose call times out, leaving
    each charge UNKNOWN (exactly what the reconciler exists to resolve)."""

    def __init__(self, target: str) -> None:
        self.oo = OpenOnce(target, migrate=False)

        @self.oo.effect(tool="stripe.charge", idempotency_key=lambda order: order)
        def charge(order: str) -> dict[str, Any]:
            raise TimeoutError("read timed out after the request was sent")

        self._charge = charge

    def unknown(self, order: str) -> str:
        """Leave one charge UNKNOWN; returns its effect id."""
        try:
            self._charge(order)
        except OutcomeUnknownError as exc:
            return exc.effect_id
        raise AssertionError(f"charge {order} did not end UNKNOWN")

    def close(self) -> None:
        self.oo.close()


def make_unknown(target: str, orders: Iterable[str]) -> dict[str, str]:
    """order -> effect id, each effect UNKNOWN."""
    agent = Agent(target)
    try:
        return {order: agent.unknown(order) for order in orders}
    finally:
        agent.close()


class Ledger:
    """Read-only SQL over the ledger tables and the sweep records (one connection)."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)

    def states(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        rows = self.conn.execute("SELECT id, state FROM openonce_effects").fetchall()
        wanted = None if ids is None else set(ids)
        return {i: s for i, s in rows if wanted is None or i in wanted}

    def effect(self, effect_id: str) -> dict[str, Any]:
        cur = self.conn.execute("SELECT * FROM openonce_effects WHERE id = %s", (effect_id,))
        names = [c.name for c in cur.description or ()]
        row = cur.fetchone()
        assert row is not None, f"no effect {effect_id}"
        return dict(zip(names, row, strict=True))

    def count_state(self, state: str) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM openonce_effects WHERE state = %s", (state,)
        ).fetchone()
        return int(row[0]) if row else 0

    def journal(self, effect_id: str | None = None) -> list[dict[str, Any]]:
        """Journal lines (effect_id, at, from_state, to_state, actor, reason,
        evidence_json), in order."""
        sql = "SELECT * FROM openonce_journal"
        if effect_id is None:
            cur = self.conn.execute(sql + " ORDER BY seq")
        else:
            cur = self.conn.execute(sql + " WHERE effect_id = %s ORDER BY seq", (effect_id,))
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def sweeps(self) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM reconciler_sweep ORDER BY id")
        names = [c.name for c in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def close(self) -> None:
        self.conn.close()


def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    what: str,
    *,
    interval: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until truthy; returns the seconds it took, or fails with ``what``
    (plus whatever ``on_timeout`` says, e.g. process logs)."""
    started = time.monotonic()
    while True:
        if predicate():
            elapsed = time.monotonic() - started
            log(f"{what}: {elapsed:.2f}s")
            return elapsed
        if time.monotonic() - started > timeout:
            extra = on_timeout() if on_timeout else ""
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}\n{extra}")
        time.sleep(interval)


def read_probe_log(path: Path) -> list[tuple[str, int]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 2:
            out.append((parts[0], int(parts[1])))
    return out


# -- probers that fail, for probe-error tests ---------------------------------------------


class RaisingProber:
    """Every probe raises: the prober itself failed, it observed nothing."""

    def __init__(self, message: str = "provider API returned 502") -> None:
        self.message = message
        self.calls = 0

    def probe(self, effect: Effect) -> ProbeResult:
        self.calls += 1
        raise ConnectionError(self.message)


FAILING_PROBERS = {"stripe.charge": RaisingProber()}
