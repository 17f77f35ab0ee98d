"""A private pgbouncer in transaction pool mode, in front of the test Postgres.

Debian's package (``make test`` installs it) is started as a child process of the tests,
never as the system service: its ini, log, pid file and auth file live in a temporary
directory, it listens on a free port of 127.0.0.1, and ``stop()`` ends it. Behind it,
clients share fewer server connections than they open, so a statement of one client often
runs on a server connection another client used a moment ago: whatever a client leaves on
its server session (a prepared statement, a LISTEN) is not there next time.

pgbouncer refuses to run as root; as root it is told to switch to the ``postgres`` user
that Debian's Postgres packages create, and its directory is handed to that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """``PgBouncer(upstream_dsn).start()``; ``dsn(database)`` names a database behind it."""

    def __init__(self, upstream_dsn: str, *, pool_size: int = 4) -> None:
        parts = urlsplit(upstream_dsn)
        self.upstream_host = parts.hostname or "127.0.0.1"
        self.upstream_port = parts.port or 5432
        self.user = parts.username or "root"
        self.pool_size = pool_size
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="oo-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    def dsn(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> PgBouncer:
        if not os.path.exists(PGBOUNCER):
            raise RuntimeError("the pgbouncer tests need Debian's pgbouncer: make test installs it")
        (self.dir / "users.txt").write_text(f'"{self.user}" ""\n')
        run_as = ""
        if os.getuid() == 0:
            run_as = "user = postgres\n"
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={self.upstream_host} port={self.upstream_port}\n"
            "[pgbouncer]\n"
            f"{run_as}"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            # Fewer server connections than clients: they are shared, as in production.
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 2000\n"
            f"admin_users = {self.user}\n"  # SHOW POOLS etc. on its "pgbouncer" database
            "log_connections = 0\n"
            "log_disconnections = 0\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        # -q: log to the log file only. A pipe nobody reads would fill up and stop it.
        self.proc = subprocess.Popen(
            [PGBOUNCER, "-q", str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen: {self.log()}") from None
                time.sleep(0.05)

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # pgbouncer's "exit now"
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def database_behind_pgbouncer(admin_dsn: str, prefix: str) -> Iterator[tuple[PgBouncer, str]]:
    """A new database (``prefix`` and a random part) and a pgbouncer in front of the server:
    the proxy and the database's name; both gone afterwards."""
    name = prefix + uuid.uuid4().hex[:10]
    create_database(admin_dsn, name)
    proxy = PgBouncer(admin_dsn).start()
    try:
        yield proxy, name
    finally:
        proxy.stop()
        drop_database(admin_dsn, name)


def create_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        # FORCE: pgbouncer still holds server connections to it.
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def reset_public_schema(dsn: str) -> None:
    """An empty ledger: the database's public schema dropped and made again."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        conn.execute("CREATE SCHEMA public")


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))
