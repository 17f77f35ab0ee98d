"""The production store: PostgreSQL through psycopg 3.

Every ledger change is a single statement in autocommit mode: the effect row, its journal
lines (and approval) are written by one statement with data-modifying CTEs, which Postgres
runs atomically. A change is one round trip and one commit, like the raw limit.

Connections are lent per statement from a small pool (:class:`ConnectionPool`), so threads
never pin them: 64 threads of an asyncio bridge share ``max_size`` connections (default 8)
and wait a moment for one instead of exhausting the server. A process opens at most
``max_size`` connections, plus one for LISTEN while a duplicate waits on an in-flight
effect. A connection the server dropped (idle timeout, restart, failover,
``pg_terminate_backend``) is discarded, and the statement is tried once more on a fresh
one when that is safe: reads always; writes after re-reading whether the first try
committed (a fenced write that committed is recognised by its fence and timestamp).

Duplicates waiting on an in-flight effect are woken by NOTIFY. A waiter registers in the
UNLOGGED table ``openonce_waiters`` (no WAL, no fsync: not a durable write); a change to an
effect with a registered waiter sends ``pg_notify`` in the same statement, delivered at
commit. Effects nobody waits on pay one index probe of an empty table.

Behind a transaction pooler (pgbouncer's ``pool_mode = transaction``) a client's
statements run on whichever server connection is free, so nothing may stay on a server
session between statements. Hence no server-side prepared statements there: psycopg would
prepare a query it has run five times, and the next run finds it missing on another server
connection. By default (``prepare=None``) each new connection asks the server which client
port it sees and prepares only when that is its own socket's TCP port (nothing between);
a Unix socket cannot tell, so it does not. ``prepare=True`` or ``False`` decides for every
connection. And no LISTEN
where the listener's session is not its own: before listening, the listener compares the
client port the server sees with its own socket's; when they differ (a pooler or a proxy
stands between), it does not LISTEN and waiters re-read the effect instead (the call path
re-reads every 0.25 s anyway). A LISTEN through pgbouncer would stay on a server connection
that other clients are then lent, and they would collect the notifications.

Leases and every other time the core writes come from the database's own clock
(:class:`~openonce_core._clock.DatabaseClock`), so hosts with skewed clocks agree.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg

from .. import _forksafe as forksafe
from .. import _schema as schema
from .._clock import ClockLike, DatabaseClock, as_clock
from .._records import Approval, Effect, JournalEntry
from . import sql
from ._wake import WakeBoard
from .base import Watch

T = TypeVar("T")
CHANNEL = "openonce_effects"


# The letters a loose identity comparison folds (``_json_field_like``).
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@functools.lru_cache(maxsize=512)
def _pg(query: str) -> str:
    """A shared query (``?`` placeholders) in psycopg's style; the reads are a few fixed
    texts, so each is converted once."""
    return query.replace("%", "%%").replace("?", "%s")


class PoolTimeout(psycopg.OperationalError):
    """No ledger connection became free in time."""


class ConnectionPool:
    """A LIFO of open connections, lent for one statement at a time.

    Written here rather than taken from psycopg_pool because it must be fork-safe (a child
    disarms every inherited socket, see ``forksafe``), runs no background threads, and lends
    in about a microsecond. Idle connections are closed after ``max_idle`` seconds."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int = 8,
        timeout: float = 30.0,
        max_idle: float = 300.0,
        connect: Callable[[], psycopg.Connection[Any]] | None = None,
        prepare: bool | None = None,
    ) -> None:
        if max_size < 1:
            raise ValueError("max_size must be at least 1")
        self.conninfo = conninfo
        self.prepare = prepare
        self.max_size = max_size
        self.timeout = timeout
        self.max_idle = max_idle
        self._connect = connect or self._default_connect
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # Idle connections, newest last. append/pop on a deque need no lock, so lending and
        # returning take no lock at all while connections are free; the condition is only
        # for opening a new one and for waiting when all are lent.
        self._idle: collections.deque[tuple[psycopg.Connection[Any], Any, float]] = (
            collections.deque()
        )
        self._open: set[psycopg.Connection[Any]] = set()
        # Connections lent when close() ran: closed as they come back, never lent again.
        self._retired: set[psycopg.Connection[Any]] = set()
        self._size = 0  # open connections, lent or idle (changed under the condition)
        self._waiting = 0  # threads waiting for one (changed under the condition)

    def _default_connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=10,
            prepare_threshold=None,  # psycopg prepares nothing until we know it may
            # A half-open connection (a server that vanished) is noticed within a minute.
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
        prepare = self.prepare
        if prepare is None:
            # Not told: prepare only on a TCP session that is provably our own (no pooler
            # between); a Unix socket cannot tell, so it does not prepare.
            try:
                prepare = _session_is_own(conn, tcp_only=True)
            except BaseException:
                _close_quietly(conn)
                raise
        if prepare:
            conn.prepare_threshold = 5  # psycopg's default: prepare on the 5th run
        return conn

    def get(self) -> tuple[psycopg.Connection[Any], Any]:
        while True:
            try:
                conn, cur, since = self._idle.pop()
            except IndexError:
                break
            if conn.closed or conn.broken or time.monotonic() - since > self.max_idle:
                self._discard(conn)
                continue
            return conn, cur
        return self._get_slow()

    def _get_slow(self) -> tuple[psycopg.Connection[Any], Any]:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    try:
                        conn, cur, _ = self._idle.pop()  # returned while we took the lock
                        if not (conn.closed or conn.broken):
                            return conn, cur
                        self._open.discard(conn)
                        self._size -= 1
                        _close_quietly(conn)
                        continue
                    except IndexError:
                        pass
                    if self._size < self.max_size:
                        self._size += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        raise PoolTimeout(
                            f"no ledger connection was free within {self.timeout:g}s"
                            f" (max_size={self.max_size}); raise max_size or lower concurrency"
                        )
            finally:
                self._waiting -= 1
        try:
            conn = self._connect()
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._open.add(conn)
        return conn, conn.cursor()

    def put(self, conn: psycopg.Connection[Any], cur: Any, *, broken: bool = False) -> None:
        if broken or conn.closed or conn.broken or (self._retired and conn in self._retired):
            self._discard(conn)
            return
        self._idle.append((conn, cur, time.monotonic()))
        if self._waiting:  # read after the append: a waiter that missed it is notified
            with self._cond:
                self._cond.notify()

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        with self._cond:
            if conn in self._open:
                self._open.discard(conn)
                self._size -= 1
            self._retired.discard(conn)
            self._cond.notify()
        _close_quietly(conn)

    def close(self) -> None:
        """Close every connection: the idle ones now, those lent to a statement in flight as
        it returns them (so the statement, say a call's finish, is not cut off). A later use
        opens new ones, as the SQLite store reopens."""
        idle: list[psycopg.Connection[Any]] = []
        with self._cond:
            while True:  # one pop at a time: a get() racing us keeps what it took
                try:
                    conn, _, _ = self._idle.pop()
                except IndexError:
                    break
                idle.append(conn)
                self._open.discard(conn)
                self._size -= 1
            self._retired |= self._open  # lent right now
            self._cond.notify_all()
        for conn in idle:
            _close_quietly(conn)

    @property
    def size(self) -> int:
        """Connections open now (lent or idle)."""
        return self._size

    def after_fork(self) -> None:
        # The parent's connections are not ours: disarm their sockets, keep the objects.
        for conn in list(self._open):
            _disarm(conn)
        self._reset()


def _disarm(conn: psycopg.Connection[Any]) -> None:
    try:
        fd = conn.pgconn.socket
    except Exception:
        fd = -1
    forksafe.disarm(fd)
    forksafe.abandon(conn)


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(Exception):
        conn.close()


def _session_is_own(conn: psycopg.Connection[Any], *, tcp_only: bool = False) -> bool:
    """Whether the server session behind ``conn`` is ours alone: the client port the
    server sees is our socket's own (both none over a Unix socket). A pooler or proxy in
    between connects from its own port. A NAT that rewrites ports also reads as "not
    ours", which only costs waiters a re-read; pgbouncer reached and reaching Postgres
    both over Unix sockets is not detected."""
    row = conn.execute("SELECT inet_client_port()").fetchone()
    server_sees = row[0] if row else None
    try:
        # A duplicate of the descriptor (closing it leaves psycopg's open); the socket's
        # family (IPv4, IPv6, Unix) is read from the descriptor itself.
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            address = sock.getsockname()
    except OSError:
        return False  # cannot tell: re-reading is always correct
    ours = address[1] if isinstance(address, tuple) else None
    if tcp_only and ours is None:
        return False
    return bool(server_sees == ours)


def _is_disconnect(exc: BaseException) -> bool:
    """The connection is gone (not a constraint or syntax error): worth one fresh try."""
    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, PoolTimeout)


class PostgresStore(sql.SQLStore):
    dialect = "postgres"
    # The server down or restarting, a dropped connection, a pool wait that timed out (all
    # psycopg.OperationalError). (No reading of the database's clock yet counts on every
    # store: stores.base.ledger_errors.)
    unavailable: tuple[type[BaseException], ...] = (psycopg.OperationalError,)

    def __init__(
        self,
        dsn: str,
        *,
        max_size: int = 8,
        timeout: float = 30.0,
        max_idle: float = 300.0,
        clock: ClockLike | None = None,
        # Accepted for compatibility; connections are always lent per statement.
        min_size: int | None = None,
        # Server-side prepared statements save the server a parse and plan per statement
        # but break behind a transaction pooler (see the module's docstring). None: only
        # where each connection is found to be direct (TCP, the server sees our own port).
        prepare: bool | None = None,
    ) -> None:
        self.dsn = dsn
        self.pool = ConnectionPool(
            dsn, max_size=max_size, timeout=timeout, max_idle=max_idle, prepare=prepare
        )
        self.clock = as_clock(clock) or DatabaseClock(self._database_time)
        self._update_sql: dict[tuple[Any, ...], str] = {}
        self._reset_process_state()
        forksafe.register(self)

    def _reset_process_state(self) -> None:
        self.board = WakeBoard()
        self._listener: threading.Thread | None = None
        self._listener_conn: psycopg.Connection[Any] | None = None
        self._listener_ready = threading.Event()
        self._listener_lock = threading.Lock()
        self._listener_stop = threading.Event()  # the running listener's; set by close()
        # Whether duplicates are woken by NOTIFY: None until the listener first connects,
        # False for good once it found its session is not its own (a pooler between).
        self.listening: bool | None = None
        self._token = uuid.uuid4().hex[:16]  # names this process's waiter registrations

    def after_fork(self) -> None:
        self.pool.after_fork()
        if self._listener_conn is not None:
            _disarm(self._listener_conn)
        if isinstance(self.clock, DatabaseClock):
            self.clock.after_fork()
        self._reset_process_state()

    # -- running statements ---------------------------------------------------------------

    def _with_cursor(self, work: Callable[[Any], T]) -> T:
        conn, cur = self.pool.get()
        try:
            result = work(cur)
        except BaseException as exc:
            self.pool.put(conn, cur, broken=_is_disconnect(exc) or conn.broken)
            raise
        self.pool.put(conn, cur)
        return result

    def _read(self, work: Callable[[Any], T]) -> T:
        """A read, tried once more on a fresh connection if the first one was dropped."""
        try:
            return self._with_cursor(work)
        except psycopg.OperationalError as exc:
            if not _is_disconnect(exc):
                raise
            return self._with_cursor(work)

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        # Every replay's read: lend, execute, return, without the closures of _read.
        stmt = _pg(query)
        conn, cur = self.pool.get()
        try:
            row = cur.execute(stmt, params).fetchone()
        except BaseException as exc:
            self.pool.put(conn, cur, broken=_is_disconnect(exc) or conn.broken)
            if not _is_disconnect(exc):
                raise
            return self._read(lambda cur: cur.execute(stmt, params).fetchone())
        self.pool.put(conn, cur)
        return row

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]:
        stmt = _pg(query)
        return self._read(lambda cur: list(cur.execute(stmt, params).fetchall()))

    def _write(self, stmt: str, params: Any, settle: Callable[[], bool | None]) -> Any:
        """Run a write; if the connection drops, ``settle`` re-reads the ledger and says
        whether the write committed (True), was not applied (None: run it once more), or
        lost to someone else (False)."""
        try:
            return self._with_cursor(lambda cur: cur.execute(stmt, params).fetchone())
        except psycopg.OperationalError as exc:
            if not _is_disconnect(exc):
                raise
            outcome = settle()
            if outcome is None:
                return self._with_cursor(lambda cur: cur.execute(stmt, params).fetchone())
            return _Settled(outcome)

    def _database_time(self) -> float:
        row = self._with_cursor(
            lambda cur: cur.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
        )
        return float(row[0])

    # -- schema ---------------------------------------------------------------------------

    def _json_field_is(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        # The text of the field, and its JSON type: "7" (a string) is not 7 (a number).
        key = sql.json_name(name)
        kind = "number" if isinstance(value, int) else "string"
        condition = (
            f"({column}::jsonb ->> '{key}') = ? AND jsonb_typeof({column}::jsonb -> '{key}') = ?"
        )
        return condition, [str(value), kind]

    def _json_field_like(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        key = sql.json_name(name)
        text = f"btrim({column}::jsonb ->> '{key}', ?)"
        kind = f"jsonb_typeof({column}::jsonb -> '{key}')"
        if isinstance(value, int):
            # A number compares as a number (7.0 is 7), text by its digits.
            number = f"({column}::jsonb -> '{key}')::numeric"
            return (
                f"CASE {kind} WHEN 'number' THEN {number} = ?"
                f" WHEN 'string' THEN ltrim({text}, '#0') = ? ELSE false END",
                [value, sql.LOOSE_TRIM, sql.loose_text(value)],
            )
        # translate, not lower: ASCII only, as loose_text and SQLite's lower() fold case.
        folded = f"translate({text}, '{_UPPER}', '{_UPPER.lower()}')"
        return f"{folded} = ? AND {kind} = 'string'", [sql.LOOSE_TRIM, sql.loose_text(value)]

    def _tool_starts_with(self, prefix: str) -> tuple[str, list[Any]]:
        # LIKE is exact under any collation (a range would follow the locale's order).
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return "tool LIKE ? ESCAPE '\\'", [pattern + "%"]

    def migrate(self) -> int:
        conn = psycopg.connect(self.dsn, prepare_threshold=None)
        try:
            with conn.transaction(), conn.cursor() as cur:
                # Two processes migrating at once take turns instead of racing on CREATE.
                cur.execute("SELECT pg_advisory_xact_lock(hashtext('openonce_schema'))")
                _, after = schema.apply(cur, "postgres")
        finally:
            conn.close()
        return after

    def schema_version(self) -> int:
        return self._read(_schema_version)

    def schema_readable_from(self) -> int:
        return self._read(lambda cur: schema.readable_from(cur, _schema_version(cur)))

    # -- writes (called by openonce_core._ledger only) -----------------------------------------

    def insert(self, effect: Effect, entries: Sequence[JournalEntry]) -> bool:
        inserted, _ = self._insert(effect, entries, find=False)
        return inserted

    def insert_or_find(
        self, effect: Effect, entries: Sequence[JournalEntry]
    ) -> tuple[bool, sql.ReplayRow | None]:
        return self._insert(effect, entries, find=True)

    def _insert(
        self, effect: Effect, entries: Sequence[JournalEntry], *, find: bool
    ) -> tuple[bool, sql.ReplayRow | None]:
        stmt = self._insert_statement(len(entries), find)
        params: list[Any] = sql.new_effect_row(effect)
        params += (effect.tool, effect.idempotency_key)
        for entry in entries:
            params += sql.journal_row(entry)[1:]
        if find:
            params += [effect.idempotency_key, effect.tool]

        def settle() -> bool | None:
            if self.get(effect.id) is not None:
                return True
            return False if self.find(effect.tool, effect.idempotency_key) else None

        row = self._write(stmt, params, settle)
        if isinstance(row, _Settled):
            return row.outcome, None
        if row is None:
            return False, None
        if row[0] == "+":
            return True, None
        return False, sql.ReplayRow(*row[1:])

    def _insert_statement(self, n_entries: int, find: bool) -> str:
        key = ("insert", n_entries, find)
        stmt = self._update_sql.get(key)
        if stmt is None:
            values = ", ".join("(" + ", ".join(["%s"] * 7) + ")" for _ in range(n_entries))
            # Not when the retention archived the key's effect: its tombstone says the call
            # ran long ago (one probe of the tombstones' key). The retention commits a
            # tombstone before it deletes the effect, and waits for statements older than
            # that commit (wait_for_older_statements), so no snapshot misses both.
            stmt = (
                f"WITH e AS (INSERT INTO openonce_effects ({', '.join(sql.NEW_COLUMNS)})"
                f" SELECT {', '.join(['%s'] * len(sql.NEW_COLUMNS))}"
                " WHERE NOT EXISTS (SELECT 1 FROM openonce_tombstones"
                " WHERE tool = %s AND idempotency_key = %s)"
                " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
                " RETURNING id),"
                f" j AS (INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS})"
                " SELECT e.id, v.* FROM e, (VALUES " + values + ") AS v)"
                f" SELECT '+', {', '.join(['NULL'] * 6)} FROM e"
            )
            if find:
                # The same round trip reads what holds the key when the insert did nothing.
                # A row committed after this statement's snapshot is not seen: the caller
                # then reads again.
                stmt += (
                    f" UNION ALL SELECT '=', {sql.REPLAY_COLUMNS} FROM openonce_effects"
                    " WHERE idempotency_key = %s AND tool = %s AND state <> 'released'"
                    " AND NOT EXISTS (SELECT 1 FROM e)"
                )
            self._update_sql[key] = stmt
        return stmt

    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entries: Sequence[JournalEntry],
        approval: Approval | None = None,
    ) -> bool:
        fields = tuple(changes)
        key = (fields, len(expect_states), len(entries), approval is not None)
        stmt = self._update_sql.get(key)
        if stmt is None:
            stmt = self._update_sql[key] = _update_statement(
                fields, len(expect_states), len(entries), approval is not None
            )
        params: list[Any] = sql.change_params(changes)
        params += [effect_id, *map(str, expect_states), expect_fence]
        for entry in entries:
            params += sql.journal_row(entry)[1:]
        if approval is not None:
            params += sql.approval_row(approval)[1:]
        params.append(effect_id)  # whose waiters to wake

        def settle() -> bool | None:
            current = self.get(effect_id)
            if current is None:
                return False
            if (
                current.fence == changes.get("fence", expect_fence + 1)
                and current.updated_at == changes.get("updated_at")
                and str(current.state) == str(changes.get("state", current.state))
            ):
                return True  # our write committed; only its reply was lost
            if current.fence == expect_fence and current.state in expect_states:
                return None  # not applied: run it once more
            return False

        row = self._write(stmt, params, settle)
        done = row.outcome if isinstance(row, _Settled) else bool(row and row[0])
        if done:
            self.board.wake(effect_id)
        return done

    def append_journal(self, entry: JournalEntry) -> None:
        stmt = _pg(sql.INSERT_JOURNAL) + " RETURNING seq"
        self._write(
            stmt,
            sql.journal_row(entry),
            lambda: True if self.has_journal_line(entry) else None,
        )

    def renew(self, effect_id: str, fence: int, owner: str, until: float) -> bool:
        stmt = _pg(sql.RENEW) + " RETURNING id"
        # Renewing twice is harmless: a lost reply is simply renewed again.
        row = self._write(stmt, (until, effect_id, fence, owner), lambda: None)
        return bool(row.outcome if isinstance(row, _Settled) else row)

    def claim(
        self,
        effect_ids: Sequence[str],
        owner: str,
        until: float,
        at: float,
        *,
        steal_from: Sequence[str] = (),
        expect_fence: int | None = None,
    ) -> list[str]:
        if not effect_ids:
            return []
        stmt = _pg(sql.claim_statement(len(effect_ids), len(steal_from), expect_fence is not None))
        params = sql.claim_params(effect_ids, owner, until, at, steal_from, expect_fence)
        try:
            return self._with_cursor(lambda cur: [r[0] for r in cur.execute(stmt, params)])
        except psycopg.OperationalError as exc:
            if not _is_disconnect(exc):
                raise
            # The claim may have landed: whatever we hold now is ours.
            return [e.id for e in self.get_many(effect_ids) if e.lease_owner == owner]

    # -- what /metrics reads of a large ledger (reconciler/metrics.py) ----------------------

    def estimated_counts(self, states: Iterable[str]) -> tuple[float, dict[str, int]] | None:
        """The planner's figures for openonce_effects, from its last ANALYZE: its rows, and
        how many of them are in each of ``states``. Costs two catalog rows, where a count
        reads every row of the state (0.5 s a million once history is nearly all committed:
        a scan of the table). None without the state column's statistics (never analyzed,
        or not readable by this role). A state the sample did not meet counts 0."""
        row = self._one(_ESTIMATES, ())
        # Not analyzed yet (reltuples -1), or analyzed without the state column's statistics
        # (a restore, a VACUUM without ANALYZE, pg_stats hidden from this role): count.
        if row is None or row[0] is None or row[0] < 0 or row[1] is None:
            return None
        rows, values, freqs = float(row[0]), row[1] or [], row[2] or []
        share = dict(zip(values, freqs, strict=False))
        return rows, {str(s): round(rows * share.get(str(s), 0.0)) for s in states}

    # -- the retention (openonce_core/_retention.py) ------------------------------------------

    def retention_write(self, work: Callable[[Any], T]) -> T:
        """Run ``work(cursor)`` in one transaction that may delete journal lines and
        approvals (``SET LOCAL openonce.retention``: the append-only trigger lets a DELETE
        through for this transaction only; an UPDATE is still refused)."""

        def in_transaction(cur: Any) -> T:
            with cur.connection.transaction():
                cur.execute("SET LOCAL openonce.retention = 'on'")
                return work(_RetentionCursor(cur, self.dialect))

        return self._with_cursor(in_transaction)

    def wait_for_older_statements(self, timeout: float) -> bool:
        """Wait until every statement that was running in this database when this is
        called has ended (True), or ``timeout`` seconds pass (False).

        A new effect's insert checks the tombstones on its statement's snapshot; one that
        started before the retention's tombstones committed did not see them, and if the
        retention then deleted the effect, the insert's unique check would wait for that
        delete and go through. So the retention deletes only once every such statement is
        over. Sessions of other roles show no ``state`` or ``query_start`` unless the
        retention's role may read all statistics: for those, the transaction each had open
        then (its virtual xid in ``pg_locks``, which every role can read) is waited for
        instead, so the wait is never skipped (an idle transaction of theirs holds it up)."""
        row = self._with_cursor(lambda cur: cur.execute(_HIDDEN_XIDS).fetchone())
        since, hidden = row[0], row[1] or []
        deadline = time.monotonic() + timeout
        older = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND state = 'active' AND query_start < %s"
            " UNION ALL SELECT count(*) FROM pg_locks"
            " WHERE locktype = 'virtualxid' AND virtualxid = ANY(%s::text[])"
        )
        while True:
            left = self._with_cursor(
                lambda cur: sum(r[0] for r in cur.execute(older, (since, hidden)).fetchall())
            )
            if not left:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    # -- waiting for another process's commit -----------------------------------------------

    def watch(self, effect_id: str) -> Watch:
        self._ensure_listener()
        if not self.listening:
            # Nobody would hear a NOTIFY: re-read instead, as often as the call path does.
            return Watch(self.board, effect_id, self.clock, poll=0.25)
        token = f"{self._token}-{uuid.uuid4().hex[:8]}"
        self._with_cursor(
            lambda cur: cur.execute(
                "INSERT INTO openonce_waiters (effect_id, token) VALUES (%s, %s)",
                (effect_id, token),
            )
        )

        def unregister() -> None:
            # A stale registration would only cost a spurious NOTIFY.
            with contextlib.suppress(psycopg.Error):
                self._with_cursor(
                    lambda cur: cur.execute(
                        "DELETE FROM openonce_waiters WHERE effect_id = %s AND token = %s",
                        (effect_id, token),
                    )
                )

        # The listener may be reconnecting: re-read at least once a second regardless.
        return Watch(self.board, effect_id, self.clock, poll=1.0, on_close=unregister)

    def _ensure_listener(self) -> None:
        if self.listening is False:
            return
        with self._listener_lock:
            if (
                self._listener is None
                or not self._listener.is_alive()
                or self._listener_stop.is_set()  # closed: a later use listens anew
            ):
                self._listener_ready.clear()
                self._listener_stop = threading.Event()
                self._listener = threading.Thread(
                    target=self._listen, args=(self._listener_stop,), name="openonce-listen",
                    daemon=True,
                )  # fmt: skip
                self._listener.start()
        self._listener_ready.wait(10)

    def _listen(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                with psycopg.connect(
                    self.dsn, autocommit=True, connect_timeout=10, prepare_threshold=None
                ) as conn:
                    self._listener_conn = conn
                    if self.listening is None:
                        self.listening = _session_is_own(conn)
                    if not self.listening:
                        self._listener_conn = None
                        self._listener_ready.set()
                        return
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listener_ready.set()
                    while not stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self.board.wake(note.payload)
            except psycopg.Error:
                # Lost the connection: waiters still re-read every second; reconnect soon.
                self._listener_conn = None
                self.board.wake_all()
                time.sleep(0.5)

    def close(self) -> None:
        """Close every connection once its statement is done (the listener's within half
        a second); a later use reopens, as on SQLite."""
        self._listener_stop.set()
        self.pool.close()


# The time, and the open transactions of the sessions whose statements this role may not
# see (``state`` is NULL for them), by their virtual xid.
_HIDDEN_XIDS = (
    "SELECT clock_timestamp(), (SELECT array_agg(l.virtualxid::text) FROM pg_locks l"
    " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'virtualxid'"
    " AND l.granted AND a.datname = current_database() AND a.pid <> pg_backend_pid()"
    " AND a.state IS NULL)"  # hidden rows show no backend_type either
)


# The effects table's row estimate and its state column's most common values with their
# shares (pg_stats, readable by whoever may read the table), in the store's search path.
_ESTIMATES = (
    "SELECT c.reltuples, s.most_common_vals::text::text[], s.most_common_freqs"
    " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
    " LEFT JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname"
    " AND s.attname = 'state' AND NOT s.inherited"
    " WHERE c.oid = 'openonce_effects'::regclass"
)


def _schema_version(cur: Any) -> int:
    exists = cur.execute("SELECT to_regclass('openonce_schema')").fetchone()
    return schema.current_version(cur) if exists and exists[0] else 0


class _RetentionCursor:
    """The retention's statements inside its transaction (``?`` placeholders)."""

    def __init__(self, cur: Any, dialect: str) -> None:
        self.cur = cur
        self.dialect = dialect

    def all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        return list(self.cur.execute(_pg(query), params).fetchall())

    def run(self, query: str, params: Sequence[Any] = ()) -> int:
        return int(self.cur.execute(_pg(query), params).rowcount)

    def run_many(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(_pg(query), rows)


class _Settled:
    """A write whose reply was lost, settled by re-reading the ledger."""

    __slots__ = ("outcome",)

    def __init__(self, outcome: bool) -> None:
        self.outcome = outcome


def _update_statement(
    fields: tuple[str, ...], n_states: int, n_entries: int, with_approval: bool
) -> str:
    sets = ", ".join(f"{sql.column(f)} = %s" for f in fields)
    states = ", ".join(["%s"] * n_states)
    values = ", ".join("(" + ", ".join(["%s"] * 7) + ")" for _ in range(n_entries))
    approval = (
        f", a AS (INSERT INTO openonce_approvals ({sql.APPROVAL_COLUMNS})"
        " SELECT u.id, %s, %s, %s, %s, %s, %s FROM u)"
        if with_approval
        else ""
    )
    return (
        f"WITH u AS (UPDATE openonce_effects SET {sets}"
        f" WHERE id = %s AND state IN ({states}) AND fence = %s RETURNING id),"
        f" j AS (INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS})"
        f" SELECT u.id, v.* FROM u, (VALUES {values}) AS v)"
        f"{approval}"
        # Wake the effect's registered waiters (none, nearly always: one probe of an empty
        # index). Evaluated once, also when the update lost its race; the winner's commit
        # notifies them too, and a waiter only re-reads.
        " SELECT count(*), (SELECT count(pg_notify('" + CHANNEL + "', w.effect_id))"
        " FROM openonce_waiters w WHERE w.effect_id = %s) FROM u"
    )
