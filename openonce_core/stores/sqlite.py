"""The embedded default: a SQLite file in WAL mode, one connection per thread.

Durability is kept: ``synchronous=FULL`` fsyncs the WAL on every commit, because a claim
that vanishes on power loss would let the same call run twice after a reboot.
Writers take the write lock up front (``BEGIN IMMEDIATE``) so two writers never deadlock
upgrading a read lock; ``busy_timeout`` queues them instead.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import schema
from ..records import Approval, Effect, JournalEntry
from . import sql
from .base import WakeBoard, Watch

_INSERT_EFFECT = (
    f"INSERT INTO openonce_effects ({', '.join(sql.NEW_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(sql.NEW_COLUMNS))})"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
)
_INSERT_JOURNAL = f"INSERT INTO openonce_journal ({sql.JOURNAL_COLUMNS}) VALUES (?,?,?,?,?,?,?)"
_INSERT_APPROVAL = f"INSERT INTO openonce_approvals ({sql.APPROVAL_COLUMNS}) VALUES (?,?,?,?,?,?,?)"
_GET = f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects WHERE id = ?"
_FIND = (
    f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
    " WHERE tool = ? AND idempotency_key = ? AND state <> 'released'"
)


class SQLiteStore:
    dialect = "sqlite"

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        poll_interval: float = 0.002,
    ) -> None:
        if path == ":memory:":
            raise ValueError("SQLiteStore needs a file; use InMemoryStore for ':memory:'")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, NORMAL or EXTRA (never OFF)")
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        # Another process's commit cannot wake us, so cross-process waiters re-read this often.
        self.poll_interval = poll_interval
        self.board = WakeBoard()
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        self._update_sql: dict[tuple[str, ...], str] = {}

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _write(self, work: Callable[[sqlite3.Connection], bool]) -> bool:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT" if done else "ROLLBACK")
        return done

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> int:
        def work(conn: sqlite3.Connection) -> bool:
            schema.apply(conn.cursor(), "sqlite")
            return True

        self._write(work)
        return schema.SCHEMA_VERSION

    def schema_version(self) -> int:
        conn = self._conn()
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'openonce_schema'"
        ).fetchone()
        return schema.current_version(conn.cursor()) if exists else 0

    # -- effects --------------------------------------------------------------------------

    def get(self, effect_id: str) -> Effect | None:
        row = self._conn().execute(_GET, (effect_id,)).fetchone()
        return sql.effect_from_row(row) if row else None

    def find(self, tool: str, idempotency_key: str) -> Effect | None:
        row = self._conn().execute(_FIND, (tool, idempotency_key)).fetchone()
        return sql.effect_from_row(row) if row else None

    def insert(self, effect: Effect, entry: JournalEntry) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(_INSERT_EFFECT, sql.new_effect_row(effect)).rowcount != 1:
                return False
            conn.execute(_INSERT_JOURNAL, sql.journal_row(entry))
            return True

        return self._write(work)

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
        stmt = self._update_sql.get((*fields, str(len(expect_states))))
        if stmt is None:
            sets = ", ".join(f"{sql.column(f)} = ?" for f in fields)
            marks = ", ".join("?" * len(expect_states))
            stmt = (
                f"UPDATE openonce_effects SET {sets}"
                f" WHERE id = ? AND state IN ({marks}) AND fence = ?"
            )
            self._update_sql[(*fields, str(len(expect_states)))] = stmt
        params = [sql.to_db(f, v) for f, v in changes.items()]
        params += [effect_id, *map(str, expect_states), expect_fence]

        def work(conn: sqlite3.Connection) -> bool:
            if conn.execute(stmt, params).rowcount != 1:
                return False
            conn.execute(_INSERT_JOURNAL, sql.journal_row(entry))
            if approval is not None:
                conn.execute(_INSERT_APPROVAL, sql.approval_row(approval))
            return True

        done = self._write(work)
        if done:
            self.board.wake(effect_id)
        return done

    def append_journal(self, entry: JournalEntry) -> None:
        def work(conn: sqlite3.Connection) -> bool:
            conn.execute(_INSERT_JOURNAL, sql.journal_row(entry))
            return True

        self._write(work)

    def journal(self, effect_id: str) -> list[JournalEntry]:
        rows = self._conn().execute(
            f"SELECT seq, {sql.JOURNAL_COLUMNS} FROM openonce_journal"
            " WHERE effect_id = ? ORDER BY seq",
            (effect_id,),
        )
        return [sql.journal_from_row(r) for r in rows]

    def approvals(self, effect_id: str) -> list[Approval]:
        rows = self._conn().execute(
            f"SELECT {sql.APPROVAL_COLUMNS} FROM openonce_approvals"
            " WHERE effect_id = ? ORDER BY id",
            (effect_id,),
        )
        return [sql.approval_from_row(r) for r in rows]

    def list_effects(self, states: Iterable[str] | None = None, limit: int = 100) -> list[Effect]:
        if states is None:
            rows = self._conn().execute(
                f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
                " ORDER BY created_at, id LIMIT ?",
                (limit,),
            )
        else:
            wanted = [str(s) for s in states]
            marks = ", ".join("?" * len(wanted))
            rows = self._conn().execute(
                f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects WHERE state IN ({marks})"
                " ORDER BY created_at, id LIMIT ?",
                (*wanted, limit),
            )
        return [sql.effect_from_row(r) for r in rows]

    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]:
        rows = self._conn().execute(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'started' AND lease_expires_at <= ?"
            " ORDER BY lease_expires_at LIMIT ?",
            (at, limit),
        )
        return [sql.effect_from_row(r) for r in rows]

    def due_unknown(
        self, before: float, limit: int = 100, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        start = after or (float("-inf"), "")
        rows = self._conn().execute(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'unknown' AND updated_at <= ? AND (updated_at, id) > (?, ?)"
            " ORDER BY updated_at, id LIMIT ?",
            (before, start[0], start[1], limit),
        )
        return [sql.effect_from_row(r) for r in rows]

    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]:
        if not effect_ids:
            return []
        marks = ", ".join("?" * len(effect_ids))
        rows = self._conn().execute(
            f"SELECT {sql.SELECT_COLUMNS} FROM openonce_effects WHERE id IN ({marks})",
            list(effect_ids),
        )
        return [sql.effect_from_row(r) for r in rows]

    def count(self, states: Iterable[str]) -> int:
        wanted = [str(s) for s in states]
        marks = ", ".join("?" * len(wanted))
        row = (
            self._conn()
            .execute(f"SELECT count(*) FROM openonce_effects WHERE state IN ({marks})", wanted)
            .fetchone()
        )
        return int(row[0])

    def count_by_state(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT state, count(*) FROM openonce_effects GROUP BY state")
        return {str(state): int(n) for state, n in rows}

    def oldest_change(self, state: str) -> float | None:
        row = (
            self._conn()
            .execute("SELECT min(updated_at) FROM openonce_effects WHERE state = ?", (state,))
            .fetchone()
        )
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
        marks = ", ".join("?" * len(effect_ids))
        fence = " AND fence = ?" if expect_fence is not None else ""
        owners = ", ".join("?" * len(steal_from)) or "NULL"
        stmt = (
            "UPDATE openonce_effects SET lease_owner = ?, lease_expires_at = ?,"
            f" fence = fence + 1 WHERE id IN ({marks}) AND state = 'unknown'"
            f" AND (lease_expires_at IS NULL OR lease_expires_at <= ? OR lease_owner IN ({owners}))"
            f"{fence} RETURNING id"
        )
        params: list[Any] = [owner, until, *effect_ids, at, *steal_from]
        if expect_fence is not None:
            params.append(expect_fence)
        claimed: list[str] = []

        def work(conn: sqlite3.Connection) -> bool:
            claimed.extend(row[0] for row in conn.execute(stmt, params).fetchall())
            return True

        self._write(work)
        return claimed

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id, poll=self.poll_interval)

    def close(self) -> None:
        with self._all_lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()
