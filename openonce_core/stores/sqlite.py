"""The embedded default: a SQLite file in WAL mode, one connection per thread; and the
in-memory store, which is the same code on one private in-memory database.

Durability is kept: ``synchronous=FULL`` fsyncs the WAL on every commit, because a claim
that vanishes on power loss would let the same call run twice after a reboot.
Writers take the write lock up front (``BEGIN IMMEDIATE``) so two writers never deadlock
upgrading a read lock; ``busy_timeout`` queues them instead. A transaction whose COMMIT
fails is rolled back before the error is raised, so the connection stays usable.

Two things SQLite cannot do, so the store refuses them or keeps them from happening:

* **A connection across ``fork``.** SQLite keeps each database file's POSIX lock state in
  process memory, shared by every connection of the process. A child that inherits it
  believes it holds the locks its parent holds, so its own connections never take a real
  lock; when the parent's last connection closes, the parent finds the file unlocked,
  checkpoints and deletes the ``-wal`` and ``-shm`` files under the child, and the child's
  commits vanish. So no connection of the store is open when the process forks: a thread
  uses its connection only while it holds its own lock, and just before ``fork`` the store
  takes every thread's lock (statements in flight finish first) and closes every
  connection; parent and child reopen on their next use. The one connection that cannot
  be closed is the forking thread's own when it forks from inside a statement (a signal
  handler, a SQLite callback): the parent goes on with it, and the child, which inherited
  its lock state, refuses the ledger's file for good (``ConfigurationError``), leaving the
  inherited connection untouched: not used, not rolled back, never closed.
* **One file under two names** (a hard link) **or on a network filesystem** (NFS, SMB, ...):
  SQLite names its WAL and finds its locks by the name, and its shared memory does not
  span hosts, so two writers would each see their own ledger and a key could run twice.
  ``ConfigurationError`` says so before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .. import _forksafe as forksafe
from .. import _schema as schema
from .._clock import SYSTEM_CLOCK, ClockLike, as_clock
from .._records import Approval, Effect, JournalEntry
from ..errors import ConfigurationError
from . import sql
from ._wake import WakeBoard
from .base import Watch

T = TypeVar("T")

# A new effect, unless its key is taken or the retention archived the key's effect (a
# tombstone: the call ran long ago and must not run again). The tombstone check is one
# probe of its primary key, inside the insert's own write transaction, so the retention
# (a writer too) cannot slip in between.
_INSERT_EFFECT = (
    f"INSERT INTO openonce_effects ({', '.join(sql.NEW_COLUMNS)})"
    f" SELECT {sql.marks(len(sql.NEW_COLUMNS))}"
    " WHERE NOT EXISTS (SELECT 1 FROM openonce_tombstones WHERE tool = ? AND idempotency_key = ?)"
    " ON CONFLICT (tool, idempotency_key) WHERE state <> 'released' DO NOTHING"
)


# Filesystems whose files other hosts can open too (by the type /proc/self/mountinfo
# shows). SQLite's locks are unreliable on them and its WAL shared memory never spans hosts.
NETWORK_FILESYSTEMS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "afs", "lustre",
    "gpfs", "beegfs", "gfs2", "ocfs2", "orangefs", "pvfs2", "ncpfs", "coda", "davfs",
})  # fmt: skip
# FUSE filesystems show as "fuse.<name>"; these reach other hosts.
NETWORK_FUSE = frozenset({
    "sshfs", "glusterfs", "ceph", "ceph-fuse", "cephfs", "s3fs", "rclone", "gcsfuse",
    "davfs", "davfs2", "juicefs", "mfs", "moosefs", "lizardfs", "goofys", "beegfs",
})  # fmt: skip


def _mountinfo_field(text: str) -> str:
    # The kernel escapes space, tab, newline and backslash in paths as octal (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def filesystem_of(path: str, mountinfo: str) -> tuple[str, str] | None:
    """``(mount point, filesystem type)`` of the mount holding ``path`` (absolute, symlinks
    resolved), read from the text of ``/proc/self/mountinfo``; None if no line parses."""
    found: tuple[str, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        try:
            mount_point = _mountinfo_field(fields[4])
            fstype = fields[fields.index("-", 6) + 1]
        except (IndexError, ValueError):
            continue
        inside = (
            mount_point == "/"
            or path == mount_point
            or path.startswith(mount_point.rstrip("/") + "/")
        )
        # The longest mount point wins; at a tie the later line (mounted on top) wins.
        if inside and (found is None or len(mount_point) >= len(found[0])):
            found = (mount_point, fstype)
    return found


def is_network_filesystem(fstype: str) -> bool:
    if fstype.startswith("fuse."):
        return fstype[len("fuse.") :] in NETWORK_FUSE
    return fstype in NETWORK_FILESYSTEMS


def _read_mountinfo() -> str | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None  # not Linux: nothing to read the filesystem type from


def refuse_network_filesystem(path: str) -> None:
    """Raise ConfigurationError if ``path`` lies on a filesystem other hosts share."""
    mountinfo = _read_mountinfo()
    if mountinfo is None:
        return
    found = filesystem_of(os.path.realpath(path), mountinfo)
    if found is not None and is_network_filesystem(found[1]):
        raise ConfigurationError(
            f"refusing to open the SQLite ledger {path!r}: it lies on a {found[1]} network"
            f" filesystem (mounted at {found[0]}), where SQLite's locks and its WAL shared"
            " memory do not hold between hosts, so two writers could each run the same key."
            " Put the ledger on a local disk, or use Postgres."
        )


def refuse_hard_links(path: str) -> None:
    """Raise ConfigurationError if the file at ``path`` has other names (hard links)."""
    try:
        links = os.stat(path).st_nlink
    except OSError:
        return  # not there yet: SQLite creates it with one name
    if links > 1:
        raise ConfigurationError(
            f"refusing to open the SQLite ledger {path!r}: the file has {links} hard links."
            " SQLite names its WAL and finds its locks by the file's name, so a writer"
            " through another name would see a ledger of its own and could run a key again."
            " Keep one name (remove the other links; a symlink is fine), or use Postgres."
        )


# Files (device, inode) this process must not open: a connection to them crossed the fork
# that made it, so SQLite's per-process lock state for them is the parent's (see above).
_CROSSED: dict[tuple[int, int], str] = {}


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _crossed_message(path: str) -> str:
    return (
        f"the SQLite ledger {path!r} cannot be used in this process: a connection to it was"
        " open in the forking thread at fork (a fork from inside a statement: a signal"
        " handler, a SQLite callback), so this process inherited its parent's lock state"
        " for the file and no connection it opens would take a real lock. The parent goes"
        " on; do the child's ledger work in a process started afresh (multiprocessing's"
        " 'spawn' or 'forkserver', or exec), or fork outside any ledger call"
    )


def _never_finalize(conns: list[sqlite3.Connection]) -> None:
    """Keep inherited connections open, untouched, to the end of this process: closing one
    (at exit, too) could roll back or checkpoint into the parent's files. Nothing may be
    called on one, not even to disarm it: forked from inside a statement, its mutex is held
    by a thread this process does not have."""
    import ctypes

    forksafe.abandon(conns)
    for conn in conns:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))  # never deallocated, even at exit


class _Slot:
    """One thread's share of the store: its connection (None before its first use, and
    again after a close or a fork), and the lock the thread holds while it uses it. Only the
    thread's own slot of ``SQLiteStore._local`` refers to it, so it goes when the thread
    ends, and a weak reference to it tells whether the connection is still in use."""

    __slots__ = ("__weakref__", "conn", "lock")

    def __init__(self) -> None:
        self.conn: sqlite3.Connection | None = None
        self.lock = threading.RLock()  # reentrant: a use inside a use on the same thread


class _Local(threading.local):
    slot: _Slot

    # This thread's connection, for code that swaps it for a stand-in (bench/ledger_gap.py
    # records the statements of one call this way).
    @property
    def conn(self) -> Any:
        return self.slot.conn

    @conn.setter
    def conn(self, conn: Any) -> None:
        self.slot.conn = conn


class SQLiteStore(sql.SQLStore):
    dialect = "sqlite"
    # A locked, missing, full or unreadable database file; not a constraint or data error.
    unavailable: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        poll_interval: float = 0.002,
        clock: ClockLike | None = None,
    ) -> None:
        if path == ":memory:" and type(self) is SQLiteStore:
            raise ValueError("SQLiteStore needs a file; use InMemoryStore for ':memory:'")
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, NORMAL or EXTRA (never OFF)")
        if path not in (":memory:", ""):
            # Reopened by this name later (a new thread, after a fork): a relative name
            # would then follow the process's current directory to another file.
            path = os.path.abspath(path)
        self.path = path
        self.synchronous = synchronous.upper()
        self.busy_timeout = busy_timeout
        # Another process's commit cannot wake us, so cross-process waiters re-read this often.
        self.poll_interval = poll_interval
        self.clock = as_clock(clock) or SYSTEM_CLOCK
        self._update_sql: dict[tuple[Any, ...], str] = {}
        if path != ":memory:":
            refuse_network_filesystem(path)
            refuse_hard_links(path)
        # Set in a child whose parent forked from inside a statement; kept for good (and
        # into the child's own children): see _crossed_message.
        self._refused: str | None = None
        self._crossing = False  # this process is forking from inside a statement
        self._reset_process_state()
        forksafe.register(self)

    def _reset_process_state(self) -> None:
        self.board = WakeBoard()
        self._local = _Local()  # each thread's _Slot
        # _guard protects the registries below and _closer; no statement takes it.
        self._guard = threading.Lock()
        self._gate = threading.Condition(self._guard)  # waits for _closer to finish
        self._slots: weakref.WeakSet[_Slot] = weakref.WeakSet()  # the live threads' slots
        # Every open connection, with a weak reference to the slot that uses it: dead
        # once that thread ended, and the connection free for another.
        self._conns: dict[sqlite3.Connection, weakref.ref[_Slot]] = {}
        self._closer: int | None = None  # the thread closing every connection (fork, close)
        self._held: list[_Slot] = []  # the slots it holds locked until _open_gate
        self._pid = os.getpid()

    def after_fork(self) -> None:
        # Normally nothing is open here (before_fork closed it all). A connection that
        # crossed anyway (a fork from inside a statement, or a fork the hooks did not see)
        # is never used nor closed, and this process refuses the file from now on.
        crossed = list(self._conns)
        self._crossing = False
        if crossed:
            _never_finalize(crossed)
            self._refused = _crossed_message(self.path)
            found = _file_id(self.path)
            if found is not None:
                _CROSSED[found] = self.path
        self._reset_process_state()

    def before_fork(self) -> None:
        self._crossing = self._close_all()
        if self._crossing:
            warnings.warn(
                f"fork() from inside a statement on the SQLite ledger {self.path!r}: this"
                " thread's connection stays open across the fork; the parent goes on with"
                " it, the child refuses the ledger",
                RuntimeWarning,
                stacklevel=2,
            )

    def after_fork_in_parent(self) -> None:
        self._crossing = False
        self._open_gate()

    def _refuse(self) -> None:
        """Raise if this process must not use the ledger (its lock state crossed a fork)."""
        if self._refused is not None:
            raise ConfigurationError(self._refused)

    # -- connections ----------------------------------------------------------------------
    #
    # A thread uses its connection only while it holds its slot's lock (_enter, then
    # slot.lock.release()), and no other thread takes that lock except _close_all. So a
    # statement costs one uncontended lock, and _close_all, by taking every slot's lock,
    # waits for the statements in flight, keeps every thread from starting another, and
    # can close every connection with none in use.

    def _enter(self) -> _Slot:
        """This thread's slot, locked: use ``slot.conn`` (or _connect), then release."""
        if self._refused is not None:
            self._refuse()
        try:
            slot = self._local.slot
        except AttributeError:
            slot = self._new_slot()
        slot.lock.acquire()
        return slot

    def _new_slot(self) -> _Slot:
        if self._pid != os.getpid():  # forked without os.register_at_fork (rare)
            self.after_fork()
        slot = _Slot()
        with self._gate:
            # Not while _close_all is at work: it holds the locks of the slots it found.
            while self._closer is not None and self._closer != threading.get_ident():
                self._gate.wait()
            self._slots.add(slot)
        self._local.slot = slot
        return slot

    def _connect(self, slot: _Slot) -> sqlite3.Connection:
        """Give the locked ``slot`` a connection: one a thread that ended left, or a new one.
        So short-lived threads do not leave a connection (and its descriptors) each."""
        with self._guard:
            free = [conn for conn, user in self._conns.items() if user() is None]
            for conn in free:
                del self._conns[conn]
        reuse = next((conn for conn in free if not conn.in_transaction), None)
        for conn in free:
            if conn is not reuse:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
        conn = reuse if reuse is not None else self._open()
        with self._guard:
            self._conns[conn] = weakref.ref(slot)
        slot.conn = conn
        return conn

    def _close_all(self) -> bool:
        """Close every connection, none in use; the gate stays shut until _open_gate.

        Returns True if this very thread is inside a statement (a fork from a signal
        handler, say): its connection is kept open rather than waited for forever."""
        me = threading.get_ident()
        mine: _Slot | None = getattr(self._local, "slot", None)
        with self._gate:
            while self._closer is not None and self._closer != me:
                self._gate.wait()  # another thread's fork or close is at work
            self._closer = me
            slots = list(self._slots)  # a slot made from now on waits in _new_slot
        # RLock's own "held by this thread" (threading.Condition relies on it too).
        kept = mine is not None and mine.lock._is_owned()  # type: ignore[attr-defined]
        for slot in slots:
            if slot is mine and kept:
                continue
            slot.lock.acquire()  # waits for that thread's statement to end
            self._held.append(slot)
        with self._guard:
            open_conns, self._conns = self._conns, {}
            for slot in self._held:
                slot.conn = None
            in_use = mine.conn if kept and mine is not None else None
            if in_use is not None and in_use in open_conns:
                self._conns[in_use] = open_conns.pop(in_use)
        for conn in open_conns:  # those of threads that ended too
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        return kept

    def _open_gate(self) -> None:
        with self._gate:
            if self._closer != threading.get_ident():
                return  # not closed by this thread
            held, self._held = self._held, []
            self._closer = None
            self._gate.notify_all()
        for slot in held:
            slot.lock.release()

    def _open(self) -> sqlite3.Connection:
        if _CROSSED and _file_id(self.path) in _CROSSED:
            raise ConfigurationError(_crossed_message(self.path))
        refuse_hard_links(self.path)  # also one made while the store was open
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
        """This thread's connection, opened if need be."""
        slot = self._enter()
        try:
            return slot.conn if slot.conn is not None else self._connect(slot)
        finally:
            slot.lock.release()

    @contextlib.contextmanager
    def _use(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for a few statements of its own."""
        slot = self._enter()
        try:
            yield slot.conn if slot.conn is not None else self._connect(slot)
        finally:
            slot.lock.release()

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        slot = self._enter()
        try:
            pid = self._pid
            conn = slot.conn if slot.conn is not None else self._connect(slot)
            row = conn.execute(query, params).fetchone()
            if pid != self._pid:
                self._crossed_during_use()
            return row
        finally:
            slot.lock.release()

    def find_replay(self, tool: str, idempotency_key: str) -> sql.ReplayRow | None:
        # Every replay's one read: _one, inlined (a replay is a few microseconds here).
        slot = self._enter()
        try:
            pid = self._pid
            conn = slot.conn if slot.conn is not None else self._connect(slot)
            row = conn.execute(sql.FIND_REPLAY, (idempotency_key, tool)).fetchone()
            if pid != self._pid:
                self._crossed_during_use()
        finally:
            slot.lock.release()
        return sql.ReplayRow._make(row) if row else None

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]:
        slot = self._enter()
        try:
            pid = self._pid
            conn = slot.conn if slot.conn is not None else self._connect(slot)
            rows = conn.execute(query, params).fetchall()
            if pid != self._pid:
                self._crossed_during_use()
            return rows
        finally:
            slot.lock.release()

    def _write(self, work: Callable[[sqlite3.Connection], bool]) -> bool:
        slot = self._enter()
        try:
            pid = self._pid
            conn = slot.conn if slot.conn is not None else self._connect(slot)
            conn.execute("BEGIN IMMEDIATE")
            try:
                done = work(conn)
                if pid != self._pid:
                    self._crossed_during_use()
                conn.execute("COMMIT" if done else "ROLLBACK")
            except BaseException:
                # Also when COMMIT itself failed: leave no transaction open behind us, or
                # every later BEGIN on this connection would fail. Never in a child this
                # connection crossed into: there it is the parent's, and not ours to touch.
                if pid == self._pid and conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
            return done
        finally:
            with contextlib.suppress(RuntimeError):
                slot.lock.release()

    def _crossed_during_use(self) -> None:
        """This use began in the parent and goes on in a child forked from inside it."""
        raise ConfigurationError(self._refused or _crossed_message(self.path))

    # -- dialect parts of the shared reads ------------------------------------------------

    def _json_field_is(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        # json_extract gives an SQL value, text or integer: "7" (text) is not 7 (integer).
        return f"json_extract({column}, '$.{sql.json_name(name)}') = ?", [value]

    def _json_field_like(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        path = f"'$.{sql.json_name(name)}'"
        text = f"trim(CAST(json_extract({column}, {path}) AS TEXT), ?)"
        kind = f"json_type({column}, {path})"
        if isinstance(value, int):
            # A number compares as a number (7.0 is 7), text by its digits.
            return (
                f"CASE {kind} WHEN 'integer' THEN json_extract({column}, {path}) = ?"
                f" WHEN 'real' THEN json_extract({column}, {path}) = ?"
                f" WHEN 'text' THEN ltrim({text}, '#0') = ? ELSE 0 END",
                [value, value, sql.LOOSE_TRIM, sql.loose_text(value)],
            )
        # SQLite's lower() folds ASCII only, as loose_text does.
        return f"lower({text}) = ? AND {kind} = 'text'", [sql.LOOSE_TRIM, sql.loose_text(value)]

    def _tool_starts_with(self, prefix: str) -> tuple[str, list[Any]]:
        # A range, not LIKE: SQLite's LIKE ignores case and cannot use the tool index, and
        # the column's BINARY collation orders by code point, so the range is exact.
        return "tool >= ? AND tool < ?", [prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)]

    # -- schema ---------------------------------------------------------------------------

    def migrate(self) -> int:
        after: list[int] = []

        def work(conn: sqlite3.Connection) -> bool:
            after.append(schema.apply(conn.cursor(), "sqlite")[1])
            return True

        self._write(work)
        return after[0]

    def schema_version(self) -> int:
        with self._use() as conn:
            return self._schema_version(conn)

    def schema_readable_from(self) -> int:
        with self._use() as conn:
            return schema.readable_from(conn.cursor(), self._schema_version(conn))

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'openonce_schema'"
        ).fetchone()
        return schema.current_version(conn.cursor()) if exists else 0

    # -- writes (called by openonce_core._ledger only) -----------------------------------------

    def insert(self, effect: Effect, entries: Sequence[JournalEntry]) -> bool:
        row = sql.new_effect_row(effect)
        row += (effect.tool, effect.idempotency_key)
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
        params = sql.change_params(changes)
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

    # -- the retention (openonce_core/_retention.py) ------------------------------------------

    def retention_write(self, work: Callable[[Any], T]) -> T:
        """Run ``work(cursor)`` in one write transaction in which the journal's and the
        approvals' delete triggers stand aside: a grant row, inserted first and deleted
        before the commit, so no other connection ever sees it."""
        result: list[T] = []

        def in_transaction(conn: sqlite3.Connection) -> bool:
            conn.execute("INSERT INTO openonce_retention_grant (token) VALUES ('retention')")
            result.append(work(_RetentionCursor(conn, self.dialect)))
            conn.execute("DELETE FROM openonce_retention_grant")
            return True

        self._write(in_transaction)
        return result[0]

    def wait_for_older_statements(self, timeout: float) -> bool:
        """Nothing to wait for: SQLite runs one writer at a time, and an insert checks the
        tombstones inside its own write transaction."""
        return True

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id, self.clock, poll=self.poll_interval)

    def close(self) -> None:
        """Close every connection once no statement is in flight; a later use reopens."""
        try:
            self._close_all()
        finally:
            self._open_gate()


class _RetentionCursor:
    """The retention's statements inside its transaction (``?`` placeholders)."""

    def __init__(self, conn: sqlite3.Connection, dialect: str) -> None:
        self.conn = conn
        self.dialect = dialect

    def all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.conn.execute(query, params).fetchall()

    def run(self, query: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(query, params).rowcount

    def run_many(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(query, rows)


class InMemoryStore(SQLiteStore):
    """A process-local ledger for tests and throwaway runs; lost on exit.

    It is the SQLite store on one private in-memory database, so every rule (the claim,
    the fence, the schema) is the very same code; one connection serves all threads,
    one at a time."""

    dialect = "memory"

    def __init__(self, *, clock: ClockLike | None = None) -> None:
        self._shared = _Slot()  # every thread's: one connection, one lock
        self._fork_lock: Any = None
        super().__init__(":memory:", clock=clock)
        self.migrate()

    def after_fork(self) -> None:
        # The child keeps its copy of the parent's in-memory ledger (fork copies memory),
        # with a lock of its own.
        self._shared.lock = threading.RLock()
        self._fork_lock = None
        self.board = WakeBoard()

    def before_fork(self) -> None:
        # Its one connection is the ledger itself, so it stays open; but no statement is
        # in flight at the fork, or the child's copy would be half-written (and SQLite's
        # mutex held by a thread the child does not have).
        self._shared.lock.acquire()
        self._fork_lock = self._shared.lock

    def after_fork_in_parent(self) -> None:
        lock, self._fork_lock = self._fork_lock, None
        if lock is not None:
            lock.release()

    def _enter(self) -> _Slot:
        self._shared.lock.acquire()
        return self._shared

    def _connect(self, slot: _Slot) -> sqlite3.Connection:
        slot.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        return slot.conn

    def watch(self, effect_id: str) -> Watch:
        return Watch(self.board, effect_id, self.clock)

    def close(self) -> None:
        pass  # the ledger lives as long as this object
