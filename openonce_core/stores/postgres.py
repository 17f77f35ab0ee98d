"""The production store: PostgreSQL through psycopg 3 and a connection pool.

Every ledger change is a single statement in autocommit mode: the effect row, its journal
line (and approval) are written by one statement with data-modifying CTEs, which Postgres
runs atomically. That keeps a change to one round trip and one commit, like the raw limit.

Each thread keeps the pool connection (and one cursor) it first borrowed until it ends or
the store closes: the hot path neither opens a connection nor pays a pool check-out per
statement. The pool bounds how many there are and replaces broken ones.

Duplicates waiting on an in-flight effect LISTEN on one channel. A waiter first bumps the
effect's ``waiters`` count; a change to an effect with waiters sends ``pg_notify`` in the
same statement, delivered at commit. Effects nobody waits on pay nothing for it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from .. import schema
from ..records import Approval, Effect, JournalEntry
from . import sql
from .base import WakeBoard, Watch

CHANNEL = "openonce_effects"
_JOURNAL_VALUES = "%(j_at)s, %(j_from)s, %(j_to)s, %(j_actor)s, %(j_reason)s, %(j_evidence)s"
_INSERT = (
    f"WITH e AS (INSERT INTO openonce_effects ({', '.join(sql.NEW_COLUMNS)})"
    f" VALUES ({', '.join('%s' for _ in sql.NEW_COLUMNS)})"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING RETURNING id)"
    f" INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS})"
    " SELECT e.id, %s, %s, %s, %s, %s, %s FROM e RETURNING seq"
)
_GET = f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects WHERE id = %s"
_FIND = (
    f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
    " WHERE tool = %s AND idempotency_key = %s AND state <> 'released'"
)


class _Pinned:
    """A pool connection held by one thread, returned to the pool when the thread ends."""

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.conn = pool.getconn()
        self.cur = self.conn.cursor()
        self._finalizer = weakref.finalize(self, _give_back, pool, self.conn, self.cur)

    def release(self) -> None:
        self._finalizer()


def _give_back(pool: ConnectionPool, conn: psycopg.Connection[Any], cur: Any) -> None:
    try:
        cur.close()
        pool.putconn(conn)  # a broken connection is discarded and replaced by the pool
    except Exception:
        pass  # the pool is closed already


class PostgresStore:
    dialect = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 32,
        pool: ConnectionPool | None = None,
    ) -> None:
        self.dsn = dsn
        self.pool = pool or ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            open=True,
            name="openonce",
        )
        self.board = WakeBoard()
        self._local = threading.local()
        self._pinned: weakref.WeakSet[_Pinned] = weakref.WeakSet()
        self._update_sql: dict[tuple[str, ...], str] = {}
        self._listener: threading.Thread | None = None
        self._listener_ready = threading.Event()
        self._listener_lock = threading.Lock()
        self._closing = False

    def _execute(self, query: str, params: Any) -> Any:
        """Run one autocommit statement on this thread's connection; returns the cursor."""
        pinned: _Pinned | None = getattr(self._local, "pinned", None)
        if pinned is None or pinned.conn.closed:
            pinned = self._local.pinned = _Pinned(self.pool)
            self._pinned.add(pinned)
        try:
            return pinned.cur.execute(query, params)
        except psycopg.OperationalError:
            # The connection is gone; give it back for the pool to replace, and let the
            # caller see the error (a write may or may not have committed).
            self._local.pinned = None
            pinned.release()
            raise

    def _one(self, query: str, params: Any) -> Any:
        return self._execute(query, params).fetchone()

    def _all(self, query: str, params: Any) -> list[Any]:
        return list(self._execute(query, params).fetchall())

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> int:
        with self.pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            # Two processes migrating at once take turns instead of racing on CREATE.
            cur.execute("SELECT pg_advisory_xact_lock(hashtext('openonce_schema'))")
            schema.apply(cur, "postgres")
        return schema.SCHEMA_VERSION

    def schema_version(self) -> int:
        with self.pool.connection() as conn:
            exists = conn.execute("SELECT to_regclass('openonce_schema')").fetchone()
            return schema.current_version(conn.cursor()) if exists and exists[0] else 0

    # -- effects --------------------------------------------------------------------------

    def get(self, effect_id: str) -> Effect | None:
        row = self._one(_GET, (effect_id,))
        return sql.effect_from_row(row) if row else None

    def find(self, tool: str, idempotency_key: str) -> Effect | None:
        row = self._one(_FIND, (tool, idempotency_key))
        return sql.effect_from_row(row) if row else None

    def insert(self, effect: Effect, entry: JournalEntry) -> bool:
        params = sql.new_effect_row(effect) + sql.journal_row(entry)[1:]
        return self._one(_INSERT, params) is not None

    def update(
        self,
        effect_id: str,
        expect_states: Sequence[str],
        expect_fence: int,
        changes: dict[str, Any],
        entry: JournalEntry,
        approval: Approval | None = None,
    ) -> bool:
        fields = tuple(changes)
        cache_key = fields + (("+approval",) if approval else ())
        stmt = self._update_sql.get(cache_key)
        if stmt is None:
            stmt = self._update_sql[cache_key] = _update_statement(fields, approval is not None)
        params: dict[str, Any] = {f"c_{f}": sql.to_db(f, v) for f, v in changes.items()}
        params.update(id=effect_id, states=[str(s) for s in expect_states], fence=expect_fence)
        _, at, from_state, to_state, actor, reason, evidence = sql.journal_row(entry)
        params.update(
            j_at=at,
            j_from=from_state,
            j_to=to_state,
            j_actor=actor,
            j_reason=reason,
            j_evidence=evidence,
        )
        if approval is not None:
            _, decision, by, a_reason, fp, a_at, expires = sql.approval_row(approval)
            params.update(
                a_decision=decision,
                a_by=by,
                a_reason=a_reason,
                a_fp=fp,
                a_at=a_at,
                a_expires=expires,
            )
        row = self._one(stmt, params)
        done = bool(row and row[0])
        if done:
            self.board.wake(effect_id)
        return done

    def append_journal(self, entry: JournalEntry) -> None:
        self._execute(
            f"INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            sql.journal_row(entry),
        )

    def journal(self, effect_id: str) -> list[JournalEntry]:
        rows = self._all(
            f"SELECT seq, {sql.JOURNAL_COLUMNS} FROM openonce_journal"
            " WHERE effect_id = %s ORDER BY seq",
            (effect_id,),
        )
        return [sql.journal_from_row(r) for r in rows]

    def approvals(self, effect_id: str) -> list[Approval]:
        rows = self._all(
            f"SELECT {sql.APPROVAL_COLUMNS} FROM openonce_approvals"
            " WHERE effect_id = %s ORDER BY id",
            (effect_id,),
        )
        return [sql.approval_from_row(r) for r in rows]

    def list_effects(self, states: Iterable[str] | None = None, limit: int = 100) -> list[Effect]:
        if states is None:
            rows = self._all(
                f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
                " ORDER BY created_at, id LIMIT %s",
                (limit,),
            )
        else:
            rows = self._all(
                f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
                " WHERE state = ANY(%s) ORDER BY created_at, id LIMIT %s",
                ([str(s) for s in states], limit),
            )
        return [sql.effect_from_row(r) for r in rows]

    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]:
        rows = self._all(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'started' AND lease_expires_at <= %s"
            " ORDER BY lease_expires_at LIMIT %s",
            (at, limit),
        )
        return [sql.effect_from_row(r) for r in rows]

    def due_unknown(
        self, before: float, limit: int = 100, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        start = after or (float("-inf"), "")
        rows = self._all(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'unknown' AND updated_at <= %s AND (updated_at, id) > (%s, %s)"
            " ORDER BY updated_at, id LIMIT %s",
            (before, start[0], start[1], limit),
        )
        return [sql.effect_from_row(r) for r in rows]

    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]:
        if not effect_ids:
            return []
        rows = self._all(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects WHERE id = ANY(%s)",
            (list(effect_ids),),
        )
        return [sql.effect_from_row(r) for r in rows]

    def count(self, states: Iterable[str]) -> int:
        row = self._one(
            "SELECT count(*) FROM openonce_effects WHERE state = ANY(%s)",
            ([str(s) for s in states],),
        )
        return int(row[0])

    def count_by_state(self) -> dict[str, int]:
        rows = self._all("SELECT state, count(*) FROM openonce_effects GROUP BY state", ())
        return {str(state): int(n) for state, n in rows}

    def oldest_change(self, state: str) -> float | None:
        row = self._one("SELECT min(updated_at) FROM openonce_effects WHERE state = %s", (state,))
        return row[0] if row else None

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
        rows = self._all(
            "UPDATE openonce_effects SET lease_owner = %(owner)s, lease_expires_at = %(until)s,"
            " fence = fence + 1 WHERE id = ANY(%(ids)s) AND state = 'unknown'"
            " AND (lease_expires_at IS NULL OR lease_expires_at <= %(at)s"
            "      OR lease_owner = ANY(%(steal)s))"
            " AND (%(fence)s::bigint IS NULL OR fence = %(fence)s::bigint) RETURNING id",
            {
                "owner": owner, "until": until, "ids": list(effect_ids), "at": at,
                "steal": list(steal_from), "fence": expect_fence,
            },
        )  # fmt: skip
        return [r[0] for r in rows]

    # -- waiting for another process's commit -----------------------------------------------

    def watch(self, effect_id: str) -> Watch:
        self._ensure_listener()
        watch = Watch(self.board, effect_id, poll=1.0)  # poll only as a safety net
        # After this commits, every change to the effect notifies (see module docstring).
        self._execute(
            "UPDATE openonce_effects SET waiters = waiters + 1 WHERE id = %s", (effect_id,)
        )
        return watch

    def _ensure_listener(self) -> None:
        with self._listener_lock:
            if self._listener is None or not self._listener.is_alive():
                self._listener_ready.clear()
                self._listener = threading.Thread(
                    target=self._listen, name="openonce-listen", daemon=True
                )
                self._listener.start()
        self._listener_ready.wait(10)

    def _listen(self) -> None:
        while not self._closing:
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listener_ready.set()
                    while not self._closing:
                        for note in conn.notifies(timeout=0.5):
                            self.board.wake(note.payload)
            except psycopg.Error:
                # Lost the connection: waiters still poll every second; reconnect shortly.
                time.sleep(0.5)

    def close(self) -> None:
        self._closing = True
        for pinned in list(self._pinned):
            pinned.release()
        self.pool.close()


def _update_statement(fields: tuple[str, ...], with_approval: bool) -> str:
    sets = ", ".join(f"{sql.column(f)} = %(c_{f})s" for f in fields)
    approval = (
        f", a AS (INSERT INTO openonce_approvals ({sql.APPROVAL_COLUMNS})"
        " SELECT u.id, %(a_decision)s, %(a_by)s, %(a_reason)s, %(a_fp)s, %(a_at)s, %(a_expires)s"
        " FROM u)"
        if with_approval
        else ""
    )
    return (
        f"WITH u AS (UPDATE openonce_effects SET {sets}"
        " WHERE id = %(id)s AND state = ANY(%(states)s) AND fence = %(fence)s"
        " RETURNING id, waiters),"
        f" j AS (INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS})"
        f" SELECT u.id, {_JOURNAL_VALUES} FROM u)"
        f"{approval},"
        f" n AS (SELECT pg_notify('{CHANNEL}', u.id) FROM u WHERE u.waiters > 0)"
        " SELECT count(*), (SELECT count(*) FROM n) FROM u"
    )
