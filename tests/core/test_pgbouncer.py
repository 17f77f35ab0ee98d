"""The ledger behind pgbouncer in transaction pool mode, beside direct connections.

Behind a transaction pooler a client's statements run on whichever server connection is
free, so nothing may be left on a server session between statements: no server-side
prepared statement (psycopg prepares a query it has run five times, and the next
statement finds ``_pg3_N`` missing on another server connection), and no LISTEN (the
notifications go to a server connection the listener no longer holds).

A private pgbouncer (``tests/support/pgbouncer.py``, Debian's package) runs for the whole
session with 4 server connections per database, fewer than the clients it serves. Its
database is made empty before each test. This module also runs the whole behavioural
suite (``tests/core/behaviour/``) once more, on Postgres through that pgbouncer: its
tests are imported below, and ``pg_dsn`` here names the database behind pgbouncer.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from behaviour.suite import *  # noqa: F403 (the behavioural suite, run behind pgbouncer)
from psycopg.conninfo import make_conninfo

from openonce_core import EffectState, OpenOnce
from openonce_core.stores.postgres import PostgresStore
from tests.support.pgbouncer import (
    PgBouncer,
    database_behind_pgbouncer,
    reset_public_schema,
    with_database,
)

THREADS = 16
CALLS_PER_THREAD = 15  # 240 calls from threads, as in the report
KEYS = 60  # fewer keys than calls: duplicates race each other
CHILDREN = 2
CALLS_PER_CHILD = 40
# Seconds from the first call's return to the duplicate's. A waiter re-reads at least every
# 0.25 s (behind pgbouncer, with no LISTEN, that is how it learns of the commit): 0.75 s
# leaves a loaded CI machine half a second of stall, and still fails a waiter that looks
# less often.
WAKE_BOUND = 0.75
PG_DSN = os.environ.get("OPENONCE_TEST_PG", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def bouncer() -> Iterator[tuple[PgBouncer, str]]:
    """pgbouncer and the name of the database behind it (dropped at the end)."""
    with database_behind_pgbouncer(PG_DSN, "oo_pgb_") as bounced:
        yield bounced


@pytest.fixture
def pg_dsn(bouncer: tuple[PgBouncer, str]) -> str:
    """Overrides conftest's: an empty database, reached through pgbouncer."""
    proxy, name = bouncer
    reset_public_schema(with_database(PG_DSN, name))
    return proxy.dsn(name)


@pytest.fixture(params=["postgres"])
def store_kind(request: Any) -> str:
    """Overrides conftest's: the imported behavioural suite runs on Postgres only, here
    the Postgres behind pgbouncer (memory and SQLite run in its own module)."""
    return str(request.param)


@pytest.fixture
def direct_dsn() -> Iterator[str]:
    """A fresh schema on a direct connection, as conftest's ``pg_dsn``."""
    schema = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in PG_DSN else "?"
    yield f"{PG_DSN}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["direct", "pgbouncer"])
def route(request: Any) -> str:
    return str(request.param)


@pytest.fixture
def route_dsn(route: str, request: Any) -> str:
    return str(request.getfixturevalue("direct_dsn" if route == "direct" else "pg_dsn"))


def _ledger(dsn: str, **kwargs: Any) -> tuple[PostgresStore, OpenOnce]:
    store = PostgresStore(dsn, max_size=8)
    store.migrate()
    return store, OpenOnce(store, retry_delay=0, **kwargs)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_many_concurrent_calls_all_commit(route_dsn: str) -> None:
    """Threads and forked processes racing on shared keys: every call returns its
    result, each key's handler runs once, and no effect is left STARTED."""
    store, oo = _ledger(route_dsn, wait_seconds=30)
    ran: list[str] = []
    lock = threading.Lock()

    @oo.effect(tool="pay", idempotency_key=lambda key: key)
    def pay(key: str) -> dict[str, Any]:
        with lock:
            ran.append(key)
        return {"key": key, "pid": os.getpid()}

    assert pay("warm-up")["key"] == "warm-up"  # the children inherit open connections

    children = []
    for c in range(CHILDREN):
        pid = os.fork()
        if pid == 0:  # the child: its own threads on its own keys, then exit 0 if all ok
            code = 1
            try:
                keys = [f"child{c}-{i % 20}" for i in range(CALLS_PER_CHILD)]
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    results = list(pool.map(pay, keys))
                if all(r["key"] == k for r, k in zip(results, keys, strict=True)):
                    code = 0
            finally:
                os._exit(code)
        children.append(pid)

    keys = [f"k-{n % KEYS}" for n in range(THREADS * CALLS_PER_THREAD)]
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(pay, key) for key in keys]
        errors = [f.exception() for f in futures if f.exception() is not None]
        assert errors == [], f"{len(errors)} of {len(keys)} calls failed: {errors[:3]}"
        assert [f.result()["key"] for f in futures] == keys

    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "a forked child's call failed"

    assert Counter(ran) == {key: 1 for key in {"warm-up", *keys}}
    effects = store.list_effects(limit=10_000)
    states = Counter(str(e.state) for e in effects)
    assert states == {str(EffectState.COMMITTED): 1 + KEYS + CHILDREN * 20}, states
    oo.close()


def test_duplicate_in_another_process_gets_the_result_promptly(route: str, route_dsn: str) -> None:
    """The first call runs on one store, its duplicate waits on another (as in another
    process: no shared wake-ups). The duplicate gets the first call's result, promptly,
    and the handler ran once."""
    _, first_oo = _ledger(route_dsn)
    second_store, second_oo = _ledger(route_dsn, wait_seconds=30)
    release, entered = threading.Event(), threading.Event()
    ran: list[str] = []

    def handler(to: str) -> dict[str, Any]:
        ran.append(to)
        entered.set()
        assert release.wait(10)
        return {"message_id": "m-1"}

    first_send = first_oo.effect(tool="email.send", idempotency_key=lambda to: to)(handler)
    second_send = second_oo.effect(tool="email.send", idempotency_key=lambda to: to)(handler)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(first_send, "a@b.c")
        assert entered.wait(10)
        duplicate = pool.submit(second_send, "a@b.c")
        deadline = time.monotonic() + 10
        while not second_store.board.waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert second_store.board.waiting(), "the duplicate never waited"
        time.sleep(0.3)  # real time, on purpose: the duplicate is parked in its wait
        release.set()
        assert first.result(10) == {"message_id": "m-1"}
        returned_first = time.monotonic()
        assert duplicate.result(10) == {"message_id": "m-1"}
        delay = time.monotonic() - returned_first
    print(f"\n[{route}] the duplicate returned {delay * 1000:.0f} ms after the first call")
    assert ran == ["a@b.c"]
    assert delay < WAKE_BOUND, f"the duplicate returned {delay:.2f}s after the first call"
    first_oo.close()
    second_oo.close()


def test_store_listens_only_where_notifications_arrive(route: str, route_dsn: str) -> None:
    """A direct connection is woken by NOTIFY; behind pgbouncer in transaction mode a
    LISTEN would stay on a server connection the listener does not hold, so waiters poll
    instead, and register nowhere."""
    store, oo = _ledger(route_dsn)
    with store.watch("no-such-effect"):
        assert store.listening is (route == "direct")
        registered = store._all("SELECT count(*) FROM openonce_waiters", ())[0][0]
        assert registered == (1 if route == "direct" else 0)
    oo.close()


@pytest.mark.skipif(
    not os.path.exists("/var/run/postgresql/.s.PGSQL.5432"), reason="no local Unix socket"
)
def test_store_listens_on_a_direct_unix_socket(direct_dsn: str) -> None:
    """Over a Unix socket neither side has a port: still our own session, so LISTEN."""
    store, oo = _ledger(make_conninfo(direct_dsn, host="/var/run/postgresql"))
    with store.watch("no-such-effect"):
        assert store.listening is True
    oo.close()


def test_no_server_connection_behind_pgbouncer_is_left_listening(
    bouncer: tuple[PgBouncer, str], pg_dsn: str
) -> None:
    """After a duplicate waited behind pgbouncer, no server connection pgbouncer lends
    is LISTENing: otherwise the clients it is lent to next collect the notifications."""
    proxy, _ = bouncer
    store, oo = _ledger(pg_dsn)
    for n in range(3):
        with store.watch(f"eff-{n}"):
            pass
    # As many clients as pgbouncer has server connections, each holding one in a
    # transaction: together they ask every server connection.
    clients = [psycopg.connect(pg_dsn, prepare_threshold=None) for _ in range(proxy.pool_size)]
    try:
        channels = [
            [row[0] for row in conn.execute("SELECT pg_listening_channels()")] for conn in clients
        ]
    finally:
        for conn in clients:
            conn.close()
    assert channels == [[]] * proxy.pool_size
    oo.close()


def test_prepared_statements_only_where_the_session_is_our_own(direct_dsn: str) -> None:
    """By default a direct TCP connection prepares (replays run about twice as fast) and
    nothing else does; ``prepare=True``/``False`` decides for every connection."""
    for prepare, expect_prepared in ((False, False), (True, True), (None, True)):
        store = PostgresStore(direct_dsn, prepare=prepare)
        store.migrate()
        for _ in range(10):
            store.get("no-such-effect")
        prepared = store._all("SELECT count(*) FROM pg_prepared_statements", ())[0][0]
        assert (prepared > 0) is expect_prepared
        store.close()


def test_console_settings_leave_nothing_on_the_server_session(pg_dsn: str) -> None:
    """The console's Django connection behind pgbouncer: no server-side cursors (a
    WITH HOLD cursor would outlive its transaction) and no prepared statements."""
    script = (
        "import json; from openonce_site.settings import base;"
        " db = base.DATABASES['default'];"
        " print(json.dumps([db.get('DISABLE_SERVER_SIDE_CURSORS'),"
        " db['OPTIONS'].get('prepare_threshold', 'unset')]))"
    )
    env = {**os.environ, "OPENONCE_DATABASE": pg_dsn}
    env.pop("OPENONCE_DB_NAME", None)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [True, None]


def test_behind_pgbouncer_nothing_is_prepared_by_default(pg_dsn: str) -> None:
    # Behind the pooler the server sees pgbouncer's port, not ours: no prepared statement
    # may be left on a server connection another client is lent next.
    store = PostgresStore(pg_dsn)
    store.migrate()
    for _ in range(10):
        store.get("no-such-effect")
    conn, _ = store.pool.get()
    try:
        assert conn.prepare_threshold is None
    finally:
        store.pool.put(conn, _)
    store.close()


def test_a_unix_socket_does_not_prepare_by_default(direct_dsn: str) -> None:
    # pgbouncer may listen on a Unix socket too, and the port check cannot see it there.
    if not os.path.exists("/var/run/postgresql/.s.PGSQL.5432"):
        pytest.skip("no local Unix socket for Postgres here")
    store = PostgresStore(make_conninfo(direct_dsn, host="/var/run/postgresql"))
    store.migrate()
    for _ in range(10):
        store.get("no-such-effect")
    assert store._all("SELECT count(*) FROM pg_prepared_statements", ())[0][0] == 0
    store.close()
