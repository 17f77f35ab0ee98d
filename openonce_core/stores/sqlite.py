"""The embedded default: a SQLite file in WAL mode, one connection per thread; and the
in-memory store, which is the same code on one private in-memory database.

Durability is kept: ``synchronous=FULL`` fsyncs the WAL on every commit, because a claim
that vanishes on power loss would let the same call run twice after a reboot.
Writers take the write lock up front (``BEGIN IMMEDIATE``) so two writers never deadlock
upgrading a read lock; ``busy_timeout`` queues them instead. A transaction whose COMMIT
fails is rolled back before the error is raised, so the connection stays usable.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import forksafe, schema
from ..clock import SYSTEM_CLOCK, Clock
from ..records import Approval, Effect, JournalEntry
from . import sql
from .base import WakeBoard, Watch

_INSERT_EFFECT = (
    f"INSERT INTO openonce_effects ({', '.join(sql.NEW_COLUMNS)})"
    f" VALUES ({sql.marks(len(sql.NEW_COLUMNS))})"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
)


class SQLiteStore(sql.SQLStore):
    dialect = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        poll_interval: float = 0.002,
        clock: Clock | None = None,
    ) -> None:
        if path == ":memory:" and type(self) is SQLiteStore:
            raise ValueError("SQLiteStore needs a file; use InMemoryStore for ':memory:'")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, NORMAL or EXTRA (never OFF)")
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        # Another process's commit cannot wake us, so cross-process waiters re-read this often.
        self.poll_interval = poll_interval
        self.clock = clock or SYSTEM_CLOCK
        self._update_sql: dict[tuple[Any, ...], str] = {}
        self._reset_process_state()
        forksafe.register(self)

    def _reset_process_state(self) -> None:
        self.board = WakeBoard()
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._pid = os.getpid()

    def after_fork(self) -> None:
        # A SQLite connection must not cross a fork: the child opens its own.
        forksafe.abandon(self._conns)
        self._reset_process_state()

    # -- connections ----------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        return conn

    def _conn(self) -> sqlite3.Connection:
        try:
            return self._local.conn  # type: ignore[no-any-return]
        except AttributeError:
            pass
        if self._pid != os.getpid():  # forked without os.register_at_fork (rare)
            self.after_fork()
        conn = self._local.conn = self._open()
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    @contextlib.contextmanager
    def _use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for a few statements of its own."""
        yield self._conn()

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        return self._conn().execute(query, params).fetchone()

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]:
        return self._conn().execute(query, params).fetchall()

    def _write(self, work: Callable[[sqlite3.Connection], bool]) -> bool:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = work(conn)
            conn.execute("COMMIT" if done else "ROLLBACK")
        except BaseException:
            # Also when COMMIT itself failed: leave no transaction open behind us, or
            # every later BEGIN on this connection would fail.
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return done

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> int:
        def work(conn: sqlite3.Connection) -> bool:
            schema.apply(conn.cursor(), "sqlite")
            return True

        self._write(work)
        return schema.SCHEMA_VERSION

    def schema_version(self) -> int:
        exists = self._one("SELECT 1 FROM sqlite_master WHERE name = 'openonce_schema'", ())
        return schema.current_version(self._conn().cursor()) if exists else 0

    # -- writes (called by openonce_core.ledger only) -----------------------------------------

    def insert(self, effect: Effect, entries: Sequence[JournalEntry]) -> bool:
        row = sql.new_effect_row(effect)

        lines = [sql.journal_row(e) for e in entries]

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(_INSERT_EFFECT, row).rowcount != 1:
                return False
            for line in lines:  # one or two: execute is cheaper than executemany here
                conn.execute(sql.INSERT_JOURNAL, line)
            return True

        return self._write(work)

    def insert_or_find(
        self, effect: Effect, entries: Sequence[JournalEntry]
    ) -> tuple[bool, sql.ReplayRow | None]:
        if self.insert(effect, entries):
            return True, None
        return False, self.find_replay(effect.tool, effect.idempotency_key)

    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entries: Sequence[JournalEntry],
        approval: Approval | None = None,
    ) -> bool:
        key = (*changes, len(expect_states))
        stmt = self._update_sql.get(key)
        if stmt is None:
            stmt = self._update_sql[key] = sql.update_statement(tuple(changes), len(expect_states))
        params = [sql.to_db(f, v) for f, v in changes.items()]
        params += [effect_id, *map(str, expect_states), expect_fence]
        lines = [sql.journal_row(e) for e in entries]

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(stmt, params).rowcount != 1:
                return False
            for line in lines:
                conn.execute(sql.INSERT_JOURNAL, line)
            if approval is not None:
                conn.execute(sql.INSERT_APPROVAL, sql.approval_row(approval))
            return True

        done = self._write(work)
        if done:
            self.board.wake(effect_id)
        return done

    def append_journal(self, entry: JournalEntry) -> None:
        line = sql.journal_row(entry)
        self._write(lambda conn: conn.execute(sql.INSERT_JOURNAL, line) is not None)

    def renew(self, effect_id: str, fence: int, owner: str, until: float) -> bool:
        params = (until, effect_id, fence, owner)
        return self._write(lambda conn: conn.execute(sql.RENEW, params).rowcount == 1)

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
        stmt = sql.claim_statement(len(effect_ids), len(steal_from), expect_fence is not None)
        params = sql.claim_params(effect_ids, owner, until, at, steal_from, expect_fence)
        claimed: list[str] = []

        def work(conn: sqlite3.Connection) -> bool:
            claimed.extend(row[0] for row in conn.execute(stmt, params).fetchall())
            return True

        self._write(work)
        return claimed

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id, self.clock, poll=self.poll_interval)

    def close(self) -> None:
        with self._conns_lock:
            for conn in self._conns:
                conn.close()
            self._conns.clear()
        self._local = threading.local()


class InMemoryStore(SQLiteStore):
    """A process-local ledger for tests and throwaway runs; lost on exit.

    It is the SQLite store on one private in-memory database, so every rule (the claim,
    the fence, the schema) is the very same code; one connection serves all threads,
    one at a time."""

    dialect = "memory"

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._lock = threading.RLock()
        self._conn_shared: sqlite3.Connection | None = None
        super().__init__(":memory:", clock=clock)
        self.migrate()

    def _reset_process_state(self) -> None:
        super()._reset_process_state()
        self._lock = threading.RLock()

    def after_fork(self) -> None:
        # The child keeps its copy of the parent's in-memory ledger (fork copies memory),
        # with a lock of its own.
        self._lock = threading.RLock()
        self.board = WakeBoard()

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)

    def _conn(self) -> sqlite3.Connection:
        if self._conn_shared is None:
            self._conn_shared = self._open()
        return self._conn_shared

    @contextlib.contextmanager
    def _use(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._conn()

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        with self._lock:
            return super()._one(query, params)

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]:
        with self._lock:
            return super()._all(query, params)

    def _write(self, work: Callable[[sqlite3.Connection], bool]) -> bool:
        with self._lock:
            return super()._write(work)

    def schema_version(self) -> int:
        with self._lock:
            return super().schema_version()

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id, self.clock)

    def close(self) -> None:
        pass  # the ledger lives as long as this object
