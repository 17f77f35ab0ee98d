"""The retention: archive, then delete, terminal effects older than a policy's age.

Nothing else ever deletes from the ledger. A run walks the terminal effects (committed,
failed, denied, cancelled, released: ``states.TERMINAL``) whose last change is older than
``RetentionPolicy.older_than`` on the ledger's clock (measured from the ledger's newest
change when the clock reads later than it: a clock stepped forward must not make recent
effects old, see ``_cutoff``), oldest first through the
``(state, updated_at, id)`` index, in batches of ``batch_size``. Each batch is three short
steps, so an agent's statement never waits long behind it:

1. **Tombstones** (one commit): the key of every effect of the batch that ran or was
   refused (all but released ones: a released claim never ran, its key is free again) is
   written to ``openonce_tombstones``. While the effect is still there its row answers a
   duplicate as before; once it is gone, the tombstone refuses the duplicate with
   :class:`~openonce_core.errors.EffectArchivedError` and the handler never runs again.
   On Postgres the run then waits for every statement older than that commit
   (``wait_for_older_statements``): an insert whose snapshot predates the tombstone would
   otherwise wait for the delete below and go through.
2. **Archive** (inside the delete's transaction, the rows locked): the effects read again,
   only those still terminal and unchanged (the same fence and ``updated_at``) are kept; a
   change made meanwhile (a late result's ``contradict``) keeps its row and loses its
   tombstone. Their rows, journal lines and approvals (and what ``deliveries`` returns)
   are appended to a gzip JSON lines file, flushed and fsynced.
3. **Delete** (the same transaction, committed only after the fsync): journal lines,
   approvals, effects. The journal's append-only triggers let the delete through for this
   transaction only (Postgres: ``SET LOCAL openonce.retention``; SQLite: a grant row that
   no other connection ever sees); UPDATE stays refused.

So no data is lost: what is deleted was durably in the archive first. A crash before the
commit leaves the effects in the ledger and, perhaps, in the archive too; importing such a
file skips them as already present. A batch that fails after its tombstones (a full disk:
``ArchiveError``, or a crash) leaves them: harmless while the effect's row answers its key
(a later run settles them); one naming an effect released since is dropped by the next
call of that key (``drop_released_tombstone``), or when the effect is archived.

On SQLite the journal's ``seq`` is its rowid, handed out as ``max + 1``: deleting the
newest line would give its number out again (and the notifier, whose cursor is past it,
would skip the new line). The effect owning the newest line is left for a later run.

The archive is one file per run, ``openonce-archive-<UTC time>-<64 random bits>.jsonl.gz``,
created exclusively (a name another run took is never appended to: ``_Archive._create``): gzip
members (one per batch) of JSON lines, one line per effect::

    {"archive_format": 1, "archived_at": 1767225600.0, "tombstone": true,
     "effect": {"id": "eff_...", "tool": "stripe.charge", "state": "committed", ...},
     "journal": [{"seq": 1, "at": ..., "from_state": "planned", "to_state": "started", ...}],
     "approvals": [{"id": 7, "decision": "approve", "by": "alice", ...}], "deliveries": [...]}

``zcat FILE | jq`` reads it; :func:`import_archive` puts it back (journal lines with their
original ``seq``, approvals with their original ``id`` unless SQLite gave that number out
again) and removes the tombstones, so the same call replays again.
"""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import math
import os
import re
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, Protocol, TypeVar

from . import _schema as schema
from ._canonical import dumps
from ._clock import Clock, SystemClock
from ._records import Effect
from ._states import TERMINAL, EffectState
from .errors import OpenOnceError
from .stores.base import Store
from .stores.sql import (
    APPROVAL_COLUMNS,
    COLUMNS,
    FIELDS,
    JOURNAL_COLUMNS,
    SELECT_COLUMNS,
    effect_from_row,
    journal_from_row,
    marks,
    to_db,
)

T = TypeVar("T")

ARCHIVE_FORMAT = 1
# A released claim never ran: its key is free again, so it leaves no tombstone.
TOMBSTONED = frozenset(TERMINAL - {EffectState.RELEASED})
# Oldest first within each state, so a run that stops early has done the oldest.
_STATES = sorted(str(s) for s in TERMINAL)
# How long a batch waits for statements older than its tombstones (Postgres) before it
# leaves its effects for a later run.
BARRIER_SECONDS = 10.0
# The longest age a policy may give: a century (a longer one is a typo, and its cutoff
# would fall before the dates a report can print).
MAX_AGE = 36500 * 86400.0
# A report names a clock this far past the ledger's newest change (see ``_cutoff``).
CLOCK_AHEAD_NOTE = 86400.0


class ArchiveError(OpenOnceError, ValueError):
    """An archive that cannot be read or imported; nothing was changed."""


class Tombstone(NamedTuple):
    """What the ledger keeps of an archived effect's key (``stores.sql.TOMBSTONE_COLUMNS``)."""

    effect_id: str
    state: str
    args_fingerprint: str
    created_at: float
    archived_at: float
    archive: str


class Cursor(Protocol):
    """A store's statements inside ``retention_write`` (``?`` placeholders)."""

    dialect: str

    def all(self, query: str, params: Sequence[Any] = ()) -> list[Any]: ...
    def run(self, query: str, params: Sequence[Any] = ()) -> int: ...
    def run_many(self, query: str, rows: Sequence[Sequence[Any]]) -> None: ...


class RetentionStore(Protocol):
    """What the retention needs of a store (the SQLite, in-memory and Postgres stores)."""

    dialect: str
    clock: Clock

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]: ...
    def tombstone(self, tool: str, idempotency_key: str) -> Any: ...
    def retention_write(self, work: Callable[[Any], T]) -> T: ...
    def wait_for_older_statements(self, timeout: float) -> bool: ...


def find_tombstone(store: Any, tool: str, idempotency_key: str) -> Tombstone | None:
    """The key's tombstone, if the retention archived its effect (a store without the
    retention has none)."""
    read = getattr(store, "tombstone", None)
    row = read(tool, idempotency_key) if read is not None else None
    return Tombstone(*row) if row else None


def drop_released_tombstone(store: Any, tool: str, idempotency_key: str, effect_id: str) -> bool:
    """Remove the key's tombstone when the effect it names is still in the ledger, released
    (a run crashed between its tombstones and its delete, and the effect was released
    since): its key is free again. True when one went."""
    drop = (
        "DELETE FROM openonce_tombstones WHERE tool = ? AND idempotency_key = ?"
        " AND effect_id = ? AND EXISTS (SELECT 1 FROM openonce_effects"
        " WHERE id = ? AND state = 'released')"
    )
    params = (tool, idempotency_key, effect_id, effect_id)
    return bool(_retention_store(store).retention_write(lambda cur: cur.run(drop, params)))


@dataclass(frozen=True)
class RetentionPolicy:
    """Which effects a run archives: terminal ones last changed more than ``older_than``
    seconds ago, ``batch_size`` per transaction; a run stops after ``max_batches`` batches
    or ``max_seconds`` (None: when none are left).

    Its pace (``pause_after``): between two batches the run rests at least ``pause``
    seconds, long enough that it archives at most ``max_rate`` effects a second (None: no
    cap), and long enough that its batches take at most ``max_busy`` of its time. A retention run
    flat out took half the rate of new effects on the ledger it cleaned (issue 19: 2,767
    effects/s archived, new effects 2.0x slower); its budget is 10M effects a day (116/s),
    so the default 500/s leaves it four times that, and on a machine too busy for 500/s it
    still works only half the time."""

    older_than: float
    batch_size: int = 500
    pause: float = 0.0
    max_batches: int | None = None
    max_seconds: float | None = None
    max_rate: float | None = 500.0
    max_busy: float = 0.5

    def pause_after(self, effects: int, seconds: float) -> float:
        """How long to rest after a batch of ``effects`` candidates that took ``seconds``."""
        rest = max(self.pause, seconds * (1 - self.max_busy) / self.max_busy)
        if self.max_rate is not None:
            rest = max(rest, effects / self.max_rate - seconds)
        return rest

    def __post_init__(self) -> None:
        if not (isinstance(self.older_than, int | float) and math.isfinite(self.older_than)):
            raise ValueError(f"older_than must be a number of seconds, not {self.older_than!r}")
        if not 0 < self.older_than <= MAX_AGE:
            raise ValueError("older_than must be more than 0 seconds and at most 36500 days")
        if not (isinstance(self.batch_size, int) and 1 <= self.batch_size <= 10_000):
            raise ValueError(f"batch_size must be 1 to 10000, not {self.batch_size!r}")
        if not self.pause >= 0:
            raise ValueError("pause must be 0 or more seconds")
        if self.max_batches is not None and self.max_batches < 1:
            raise ValueError("max_batches must be at least 1 (or None)")
        if self.max_seconds is not None and not self.max_seconds > 0:
            raise ValueError("max_seconds must be more than 0 (or None)")
        if self.max_rate is not None and not 0 < self.max_rate < math.inf:
            raise ValueError(
                f"max_rate must be more than 0 effects a second (or None), not {self.max_rate!r}"
            )
        if not 0 < self.max_busy <= 1:
            raise ValueError(f"max_busy must be more than 0 and at most 1, not {self.max_busy!r}")


@dataclass
class RetentionReport:
    """What a run archived and deleted (with ``dry_run``: what it would)."""

    effects: int = 0
    journal_lines: int = 0
    approvals: int = 0
    deliveries: int = 0
    tombstones: int = 0
    # Candidates left in the ledger: changed meanwhile, or (SQLite) holding the newest
    # journal line. A later run looks at them again.
    kept: int = 0
    batches: int = 0
    archives: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cutoff: float = 0.0  # effects last changed before this (ledger clock) were candidates
    # How far the clock read past the ledger's newest change (ages are measured from the
    # earlier of the two: a clock stepped forward does not make recent effects old).
    clock_ahead: float = 0.0
    more: bool = False  # stopped by max_batches / max_seconds with candidates left
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        verb = "would archive" if self.dry_run else "archived"
        text = (
            f"{verb} {self.effects} effect(s), {self.journal_lines} journal line(s),"
            f" {self.approvals} approval(s), {self.deliveries} delivery(ies) last changed"
            f" before {_utc(self.cutoff)} in {self.batches} batch(es), {self.seconds:.1f}s"
        )
        if not self.dry_run:
            text += f"; {self.tombstones} key tombstone(s)"
        if self.kept:
            text += f"; {self.kept} left for a later run (changed meanwhile or newest line)"
        if self.more:
            text += "; stopped at the run's limit with more to do"
        if self.clock_ahead >= CLOCK_AHEAD_NOTE:
            text += (
                f"; the clock read {self.clock_ahead / 86400:.1f} day(s) past the ledger's"
                " newest change (a clock step, or a ledger idle since): ages were measured"
                " from that change"
            )
        for path in self.archives:
            text += f"\n  archive: {path}"
        return text


@dataclass
class ImportReport:
    effects: int = 0
    journal_lines: int = 0
    approvals: int = 0
    skipped: list[str] = field(default_factory=list)  # already in the ledger, unchanged
    truncated: bool = False  # the file ended inside a batch (a crashed run never deleted it)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        text = (
            f"imported {self.effects} effect(s), {self.journal_lines} journal line(s),"
            f" {self.approvals} approval(s)"
        )
        if self.skipped:
            text += f"; skipped {len(self.skipped)} effect(s) already in the ledger"
        if self.truncated:
            text += (
                "; the file ends inside a batch: if a run stopped while writing it, that"
                " batch was never deleted; if this copy was cut short, restore the whole file"
            )
        return text


# Called with a batch's effect ids: their deliveries, by effect id, to keep in the archive
# (the notifier's, in the Django daemon); then, after the delete committed, to forget them.
ArchiveDeliveries = Callable[[list[str]], Mapping[str, list[Any]]]
ForgetDeliveries = Callable[[list[str]], Any]


class _Candidate(NamedTuple):
    id: str
    tool: str
    idempotency_key: str
    fence: int
    updated_at: float


def _retention_store(store: Any) -> RetentionStore:
    if not callable(getattr(store, "retention_write", None)):
        raise TypeError(
            f"{type(store).__name__} has no retention: use the SQLite, in-memory or Postgres store"
        )
    schema.require_usable_store(store)  # a ledger never migrated (or too new): say so
    return store  # type: ignore[no-any-return]


def run_retention(
    store: Store,
    policy: RetentionPolicy,
    archive_dir: str | os.PathLike[str],
    now: float | None = None,
    *,
    dry_run: bool = False,
    deliveries: ArchiveDeliveries | None = None,
    forget_deliveries: ForgetDeliveries | None = None,
    timer: Clock | None = None,
) -> RetentionReport:
    """Archive, then delete, the terminal effects ``policy`` selects (module docstring).
    ``now`` overrides the ledger's clock; ``timer`` is what the run times its batches and
    rests with (``policy.pause_after``, ``max_seconds``): real time unless given."""
    timer = timer or SystemClock()
    started = timer.monotonic()
    writer = _retention_store(store)
    clock_now = writer.clock.now if now is None else lambda: now
    report = RetentionReport(dry_run=dry_run)
    report.cutoff, report.clock_ahead = _cutoff(writer, clock_now(), policy.older_than)
    archive = _Archive(os.fspath(archive_dir))
    if not dry_run:
        archive.check_dir()
    rest = 0.0  # owed by the last batch; none after the run's last
    for state in _STATES:
        after: tuple[float, str] = (float("-inf"), "")
        while True:
            if _out_of_budget(policy, report, started, timer):
                report.more = _any_left(writer, state, report.cutoff, after)
                report.archives = archive.paths()
                report.seconds = timer.monotonic() - started
                return report
            batch = _candidates(writer, state, report.cutoff, after, policy.batch_size)
            if not batch:
                break
            after = (batch[-1].updated_at, batch[-1].id)
            if rest > 0:
                timer.sleep(rest)  # the hot path's share of the machine (policy docstring)
            began = timer.monotonic()
            if dry_run:
                _count(writer, batch, report)
                rest = policy.pause
            else:
                _archive_batch(
                    writer, batch, archive, clock_now(), report, deliveries, forget_deliveries
                )
                if not report.batches:
                    _replan_tombstone_checks(writer)
                rest = policy.pause_after(len(batch), timer.monotonic() - began)
            report.batches += 1
    report.archives = archive.paths()
    report.seconds = timer.monotonic() - started
    return report


# Below this many rows in the tombstones' statistics, ANALYZE them once per run (below).
TOMBSTONE_STATS_FLOOR = 10_000


def _replan_tombstone_checks(store: RetentionStore) -> None:
    """Postgres: make every session plan its tombstone check again, on the table's size.

    An agent's insert (a prepared statement) checks the key's tombstone. Planned while the
    table was empty, the check is a scan of the whole table, and Postgres keeps that plan
    until the table's statistics change: the first run filled the table under it, and every
    new effect read all tombstones (measured: 10 ms each at 20,000 tombstones; new effects
    at half the empty ledger's rate during the run, and after it, until autovacuum analyzed
    the table). ANALYZE records its size and invalidates those plans: the check is planned
    again, through the key's index. Once the statistics count enough rows no plan scans
    it, and a large table's ANALYZE is not paid again. (It needs the table's owner: another
    role gets a warning and the run goes on.)"""
    if store.dialect != "postgres":
        return  # SQLite plans each statement on its own statistics, never kept ones
    rows = store._all(
        "SELECT reltuples FROM pg_class WHERE oid = 'openonce_tombstones'::regclass", ()
    )
    if rows and rows[0][0] < TOMBSTONE_STATS_FLOOR:
        store.retention_write(lambda cur: cur.run("ANALYZE openonce_tombstones"))


def _cutoff(store: RetentionStore, now: float, older_than: float) -> tuple[float, float]:
    """The time before which an effect's last change makes it old, and how far ``now``
    reads past the ledger's newest change.

    Age is measured from ``now`` or from the ledger's newest change, whichever is earlier.
    A clock stepped forward (an NTP step, a VM restored from a snapshot) would otherwise
    make every terminal effect old at once: each archived, its key refusing a replay of a
    call made days ago. Measured from the newest change, a run never archives more than a
    right clock would have at the moment of that change; a ledger idle since keeps its
    last ``older_than`` of activity, which costs little. A clock stepped back gives an
    earlier cutoff: fewer effects are old, none is lost."""
    newest = _newest_change(store)
    if newest is None or newest >= now:
        return now - older_than, 0.0
    return newest - older_than, now - newest


def _newest_change(store: RetentionStore) -> float | None:
    """The newest ``updated_at`` in the ledger: the greatest of each state's, each the last
    entry of a range of the ``(state, updated_at, id)`` index."""
    states = [str(s) for s in EffectState]
    newest = " UNION ALL ".join(
        ["SELECT max(updated_at) FROM openonce_effects WHERE state = ?"] * len(states)
    )
    times = [row[0] for row in store._all(newest, states) if row[0] is not None]
    return max(times) if times else None


def _out_of_budget(
    policy: RetentionPolicy, report: RetentionReport, started: float, timer: Clock
) -> bool:
    if not report.batches:
        return False  # every run makes progress, however small its budget
    if policy.max_batches is not None and report.batches >= policy.max_batches:
        return True
    return policy.max_seconds is not None and timer.monotonic() - started >= policy.max_seconds


def _any_left(store: RetentionStore, state: str, cutoff: float, after: tuple[float, str]) -> bool:
    if _candidates(store, state, cutoff, after, 1):
        return True
    later = _STATES[_STATES.index(state) + 1 :]
    return any(_candidates(store, s, cutoff, (float("-inf"), ""), 1) for s in later)


def _candidates(
    store: RetentionStore, state: str, cutoff: float, after: tuple[float, str], limit: int
) -> list[_Candidate]:
    # A range of the (state, updated_at, id) index, after the last batch's end: rows left
    # behind (changed, or holding the newest line) are not read again in this run.
    rows = store._all(
        "SELECT id, tool, idempotency_key, fence, updated_at FROM openonce_effects"
        " WHERE state = ? AND updated_at < ? AND (updated_at, id) > (?, ?)"
        " ORDER BY updated_at, id LIMIT ?",
        (state, cutoff, after[0], after[1], limit),
    )
    return [_Candidate(*r) for r in rows]


def _count(store: RetentionStore, batch: list[_Candidate], report: RetentionReport) -> None:
    newest = _newest_line_owner(store.dialect, lambda q: store._all(q, ()))
    ids = [c.id for c in batch if c.id != newest]
    report.kept += len(batch) - len(ids)
    if not ids:
        return
    inside = marks(len(ids))
    report.effects += len(ids)
    for table, attr in (("openonce_journal", "journal_lines"), ("openonce_approvals", "approvals")):
        row = store._all(f"SELECT count(*) FROM {table} WHERE effect_id IN ({inside})", ids)
        setattr(report, attr, getattr(report, attr) + int(row[0][0]))


def _archive_batch(
    store: RetentionStore,
    batch: list[_Candidate],
    archive: _Archive,
    archived_at: float,
    report: RetentionReport,
    deliveries: ArchiveDeliveries | None,
    forget_deliveries: ForgetDeliveries | None,
) -> None:
    ids = [c.id for c in batch]
    path = archive.path()
    store.retention_write(lambda cur: _write_tombstones(cur, ids, archived_at, path))
    # Should the rest fail (a full disk), the tombstones stay: harmless while the rows
    # answer their keys, and not ours to drop (a run beside this one may have taken them
    # over for a batch it is about to delete).
    settled = store.wait_for_older_statements(BARRIER_SECONDS)
    done = store.retention_write(
        lambda cur: _archive_and_delete(
            cur, batch, archive, archived_at, settled, deliveries, report
        )
    )
    if done and forget_deliveries is not None:
        forget_deliveries(done)


_WRITE_TOMBSTONES = (
    "INSERT INTO openonce_tombstones (tool, idempotency_key, effect_id, state,"
    " args_fingerprint, created_at, archived_at, archive)"
    " SELECT tool, idempotency_key, id, state, args_fingerprint, created_at, ?, ?"
    " FROM openonce_effects WHERE id IN ({ids}) AND state IN ({states})"
    # Only a run that stopped between its two commits left one: this run's is the truth.
    " ON CONFLICT (tool, idempotency_key) DO UPDATE SET effect_id = excluded.effect_id,"
    " state = excluded.state, args_fingerprint = excluded.args_fingerprint,"
    " created_at = excluded.created_at, archived_at = excluded.archived_at,"
    " archive = excluded.archive"
)


def _write_tombstones(cur: Cursor, ids: list[str], archived_at: float, path: str) -> int:
    states = sorted(str(s) for s in TOMBSTONED)
    stmt = _WRITE_TOMBSTONES.format(ids=marks(len(ids)), states=marks(len(states)))
    return cur.run(stmt, (archived_at, path, *ids, *states))


def _archive_and_delete(
    cur: Cursor,
    batch: list[_Candidate],
    archive: _Archive,
    archived_at: float,
    settled: bool,
    deliveries: ArchiveDeliveries | None,
    report: RetentionReport,
) -> list[str]:
    """Inside the delete's transaction: lock and re-read the batch, archive what is still
    as selected, fsync, delete it. Returns the ids deleted."""
    wanted = {c.id: c for c in batch}
    lock = " FOR UPDATE" if cur.dialect == "postgres" else ""  # SQLite: the write lock
    rows = cur.all(
        f"SELECT {SELECT_COLUMNS} FROM openonce_effects WHERE id IN ({marks(len(batch))}){lock}",
        list(wanted),
    )
    effects = [effect_from_row(r) for r in rows]
    newest = _newest_line_owner(cur.dialect, cur.all)
    gone = [
        e
        for e in effects
        if settled
        and e.state in TERMINAL
        and (e.fence, e.updated_at) == (wanted[e.id].fence, wanted[e.id].updated_at)
        and e.id != newest
    ]
    # Left in the ledger: its tombstone (if this run wrote one) goes, or the key would
    # stay refused should the effect ever be released. (One no longer there was archived
    # by a run beside this one: its tombstone stays.)
    gone_ids = {e.id for e in gone}
    left = [e for e in effects if e.id not in gone_ids]
    cur.run_many(
        "DELETE FROM openonce_tombstones WHERE tool = ? AND idempotency_key = ? AND effect_id = ?",
        [(e.tool, e.idempotency_key, e.id) for e in left],
    )
    report.kept += len(left)
    if not gone:
        return []
    ids = [e.id for e in gone]
    inside = marks(len(ids))
    journal = cur.all(
        f"SELECT seq, {JOURNAL_COLUMNS} FROM openonce_journal"
        f" WHERE effect_id IN ({inside}) ORDER BY seq",
        ids,
    )
    approvals = cur.all(
        f"SELECT id, {APPROVAL_COLUMNS} FROM openonce_approvals"
        f" WHERE effect_id IN ({inside}) ORDER BY id",
        ids,
    )
    extra = deliveries(ids) if deliveries is not None else {}
    lines = _archive_lines(gone, journal, approvals, extra, archived_at)
    archive.append(lines)  # fsynced: only now may the delete commit
    # The tombstone names the file that holds the effect (a run beside this one may have
    # written its own file's name since this run's tombstones). Only then: an update that
    # changes nothing would still leave a dead row version behind, doubling a tombstone's
    # cost (measured: 800 bytes per archived effect instead of about 460).
    cur.run_many(
        "UPDATE openonce_tombstones SET archive = ?, archived_at = ?"
        " WHERE tool = ? AND idempotency_key = ? AND effect_id = ? AND archive <> ?",
        [
            (archive.path(), archived_at, e.tool, e.idempotency_key, e.id, archive.path())
            for e in gone
            if e.state in TOMBSTONED
        ],
    )
    # A released effect's key is free: a tombstone naming it (left by a crashed run
    # before the effect was released) goes with it.
    cur.run_many(
        "DELETE FROM openonce_tombstones WHERE tool = ? AND idempotency_key = ? AND effect_id = ?",
        [(e.tool, e.idempotency_key, e.id) for e in gone if e.state not in TOMBSTONED],
    )
    cur.run(f"DELETE FROM openonce_journal WHERE effect_id IN ({inside})", ids)
    cur.run(f"DELETE FROM openonce_approvals WHERE effect_id IN ({inside})", ids)
    cur.run(f"DELETE FROM openonce_effects WHERE id IN ({inside})", ids)
    report.effects += len(gone)
    report.journal_lines += len(journal)
    report.approvals += len(approvals)
    report.deliveries += sum(len(extra.get(i, ())) for i in ids)
    report.tombstones += sum(1 for e in gone if e.state in TOMBSTONED)
    return ids


def _newest_line_owner(dialect: str, read: Callable[[str], list[Any]]) -> str | None:
    """SQLite hands the journal's rowid out as max + 1: the newest line stays."""
    if dialect == "postgres":
        return None  # a bigserial never hands a number out twice
    rows = read("SELECT effect_id FROM openonce_journal ORDER BY seq DESC LIMIT 1")
    return rows[0][0] if rows else None


def _archive_lines(
    effects: list[Effect],
    journal: list[Any],
    approvals: list[Any],
    extra: Mapping[str, list[Any]],
    archived_at: float,
) -> bytes:
    lines_of: dict[str, list[dict[str, Any]]] = {e.id: [] for e in effects}
    for row in journal:
        entry = journal_from_row(row)
        lines_of[entry.effect_id].append(
            {
                "seq": entry.seq,
                "at": entry.at,
                "from_state": entry.from_state,
                "to_state": entry.to_state,
                "actor": entry.actor,
                "reason": entry.reason,
                "evidence": entry.evidence,
                "action": entry.action,
            }
        )
    approvals_of: dict[str, list[dict[str, Any]]] = {e.id: [] for e in effects}
    for number, effect_id, decision, by, reason, fingerprint, at, expires_at in approvals:
        approvals_of[effect_id].append(
            {
                "id": number,
                "decision": decision,
                "by": by,
                "reason": reason,
                "args_fingerprint": fingerprint,
                "at": at,
                "expires_at": expires_at,
            }
        )
    out = []
    for e in effects:
        doc = {
            "archive_format": ARCHIVE_FORMAT,
            "archived_at": archived_at,
            "tombstone": e.state in TOMBSTONED,
            "effect": {**dataclasses.asdict(e), "state": str(e.state)},
            "journal": lines_of[e.id],
            "approvals": approvals_of[e.id],
            "deliveries": list(extra.get(e.id, ())),
        }
        out.append(json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str))
    return ("\n".join(out) + "\n").encode()


class _Archive:
    """One run's archive file, created at its first batch; each batch is one gzip member,
    appended, flushed and fsynced before that batch's delete commits."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._path = os.path.join(os.path.abspath(folder), _archive_name())
        self._written = False

    def check_dir(self) -> None:
        """Refuse early, before any tombstone is written, a folder we cannot write to."""
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as exc:
            raise ArchiveError(f"cannot create the archive folder {self.folder!r}: {exc}") from None
        if not os.access(self.folder, os.W_OK | os.X_OK):
            raise ArchiveError(f"the archive folder {self.folder!r} is not writable")

    def path(self) -> str:
        return self._path

    def paths(self) -> list[str]:
        return [self._path] if self._written else []

    def append(self, lines: bytes) -> None:
        """Raises ArchiveError when the batch is not durably in the file (a full disk):
        the batch's transaction then rolls back and nothing of it is deleted."""
        member = gzip.compress(lines, mtime=0)
        try:
            if not self._written:
                self._create()
            with open(self._path, "ab") as f:
                f.write(member)
                f.flush()
                os.fsync(f.fileno())
            if not self._written:
                # The file's name must be durable too, or a crash could lose the file.
                fd = os.open(os.path.dirname(self._path), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            hint = " (the disk is full)" if exc.errno == errno.ENOSPC else ""
            raise ArchiveError(
                f"cannot write the archive {self._path}{hint}: {exc}; nothing of this batch"
                " was deleted (a partly written batch is skipped on import)"
            ) from exc
        self._written = True

    def _create(self) -> None:
        """Create this run's file, never one that exists: another run (another host on a
        shared volume, a container whose hostname, pid and clock match ours) may have
        taken the name, and its file holds its own ledger's effects. A taken name is
        replaced by a new one; the tombstones that named it are corrected to the file
        their effects land in before the batch commits."""
        for _ in range(_NAME_TRIES):
            try:
                os.close(os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return
            except FileExistsError:
                self._path = os.path.join(os.path.dirname(self._path), _archive_name())
        raise FileExistsError(errno.EEXIST, "no free archive name", self._path)


_NAME_TRIES = 5


def _archive_name() -> str:
    """The UTC second and 64 random bits: two runs at the same second on hosts that share
    a name (or a pid, or a restored snapshot's state) draw different names."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"openonce-archive-{stamp}-{uuid.uuid4().hex[:16]}.jsonl.gz"


# -- import --------------------------------------------------------------------------------


def read_archive(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], bool]:
    """The archive's effect lines, and whether its last batch was cut short (a crash while
    writing it: those effects were never deleted)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ArchiveError(f"cannot read the archive {os.fspath(path)!r}: {exc}") from None
    data, truncated = _gunzip(raw, os.fspath(path))
    text = data.decode("utf-8", errors="strict")
    lines = text.split("\n")
    if truncated and lines and lines[-1]:
        lines.pop()  # a partial line of the batch that was cut short
    docs = []
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ArchiveError(f"{os.fspath(path)}: line {number} is not JSON: {exc}") from None
        _check_line(doc, f"{os.fspath(path)}: line {number}")
        docs.append(doc)
    return docs, truncated


def _gunzip(raw: bytes, name: str) -> tuple[bytes, bool]:
    """Every gzip member's data; a last member cut short gives what it holds, and True."""
    out = bytearray()
    while raw:
        inflater = zlib.decompressobj(wbits=31)  # one gzip member
        try:
            out += inflater.decompress(raw)
        except zlib.error as exc:
            raise ArchiveError(f"{name} is not a gzip archive: {exc}") from None
        if not inflater.eof:
            return bytes(out), True
        raw = inflater.unused_data
    return bytes(out), False


_KNOWN_FIELDS = frozenset(FIELDS)
_EFFECT_ID = re.compile(r"eff_[0-9a-f]{32}")


def _check_line(doc: Any, where: str) -> None:
    if not isinstance(doc, dict) or doc.get("archive_format") != ARCHIVE_FORMAT:
        raise ArchiveError(f"{where}: not an OpenOnce archive line (archive_format 1)")
    effect = doc.get("effect")
    if not isinstance(effect, dict) or not isinstance(effect.get("id"), str):
        raise ArchiveError(f"{where}: no effect in it")
    # The retention writes only ids the library made; another id ("a/b", a space, a
    # thousand characters) would come back as an effect no console link can name.
    if not _EFFECT_ID.fullmatch(effect["id"]):
        raise ArchiveError(
            f"{where}: effect id {effect['id'][:80]!r} is not one OpenOnce makes"
            " (eff_ and 32 hexadecimal digits)"
        )
    unknown = set(effect) - _KNOWN_FIELDS
    if unknown:
        raise ArchiveError(
            f"{where}: fields this version does not know ({', '.join(sorted(unknown))});"
            " import with the version that wrote it"
        )
    if not isinstance(doc.get("journal"), list) or not isinstance(doc.get("approvals"), list):
        raise ArchiveError(f"{where}: journal and approvals must be lists")
    # The retention archives terminal effects only: anything else was not written by it.
    if effect.get("state") not in {str(s) for s in TERMINAL}:
        raise ArchiveError(f"{where}: effect state {effect.get('state')!r} is not terminal")
    if not isinstance(effect.get("args"), dict):
        raise ArchiveError(f"{where}: the effect's args must be an object")
    _check_entries(doc["journal"], _LINE_FIELDS, f"{where}: journal line")
    _check_entries(doc["approvals"], _APPROVAL_FIELDS, f"{where}: approval")


_LINE_FIELDS = {"seq": int, "at": float, "from_state": str, "to_state": str, "actor": str}
_APPROVAL_FIELDS = {"decision": str, "by": str, "reason": str, "args_fingerprint": str,
                    "at": float}  # fmt: skip


def _check_entries(entries: list[Any], fields: dict[str, type], what: str) -> None:
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ArchiveError(f"{what} {number} is not an object")
        for name, kind in fields.items():
            value = entry.get(name)
            ok = isinstance(value, int | float) if kind is float else isinstance(value, kind)
            if not ok or isinstance(value, bool):
                raise ArchiveError(f"{what} {number}: {name!r} missing or not a {kind.__name__}")


def import_archive(store: Store, path: str | os.PathLike[str]) -> ImportReport:
    """Put an archive's effects back, with their journal lines (original ``seq``) and
    approvals, and remove their tombstones, in one transaction. An effect already in the
    ledger unchanged is skipped (a second import, or a batch whose delete never
    committed); one that differs, or a key another live effect holds, refuses the whole
    import (ArchiveError) and nothing changes."""
    writer = _retention_store(store)
    docs, truncated = read_archive(path)
    report = ImportReport(truncated=truncated)
    effects = [_effect_of(doc) for doc in docs]
    try:
        writer.retention_write(lambda cur: _import(cur, docs, effects, report))
    except ArchiveError:
        raise
    except Exception as exc:  # a value the ledger's columns refuse: rolled back
        raise ArchiveError(
            f"{os.fspath(path)} cannot be imported ({type(exc).__name__}: {exc});"
            " nothing was imported"
        ) from exc
    return report


def _effect_of(doc: dict[str, Any]) -> Effect:
    fields = dict(doc["effect"])
    try:
        fields["state"] = EffectState(fields["state"])
        return Effect(**fields)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArchiveError(f"effect {fields.get('id')!r}: not a whole effect: {exc}") from None


_INSERT_EFFECT = (
    f"INSERT INTO openonce_effects ({', '.join(COLUMNS)}) VALUES ({marks(len(COLUMNS))})"
)
_INSERT_LINE = f"INSERT INTO openonce_journal (seq, {JOURNAL_COLUMNS}) VALUES ({marks(9)})"
_INSERT_APPROVAL = f"INSERT INTO openonce_approvals ({APPROVAL_COLUMNS}) VALUES ({marks(7)})"


def _import(
    cur: Cursor, docs: list[dict[str, Any]], effects: list[Effect], report: ImportReport
) -> None:
    for doc, effect in zip(docs, effects, strict=True):
        if _already_there(cur, effect):
            report.skipped.append(effect.id)
            continue
        cur.run(_INSERT_EFFECT, [to_db(f, getattr(effect, f)) for f in FIELDS])
        for line in doc["journal"]:
            _insert_line(cur, effect.id, line)
        for a in doc["approvals"]:
            _insert_approval(cur, effect.id, a)
        cur.run(
            "DELETE FROM openonce_tombstones WHERE tool = ? AND idempotency_key = ?"
            " AND effect_id = ?",
            (effect.tool, effect.idempotency_key, effect.id),
        )
        report.effects += 1
        report.journal_lines += len(doc["journal"])
        report.approvals += len(doc["approvals"])


def _already_there(cur: Cursor, effect: Effect) -> bool:
    """True when the ledger holds this very effect unchanged; raises when importing it
    would overwrite or shadow something the ledger holds now."""
    rows = cur.all(
        "SELECT state, fence, updated_at FROM openonce_effects WHERE id = ?", (effect.id,)
    )
    if rows:
        if tuple(rows[0]) == (str(effect.state), effect.fence, effect.updated_at):
            return True
        raise ArchiveError(
            f"effect {effect.id} is in the ledger already and differs from the archive"
            f" (ledger: {rows[0][0]}, fence {rows[0][1]}; archive: {effect.state}, fence"
            f" {effect.fence}); nothing was imported"
        )
    if effect.state != EffectState.RELEASED:
        holder = cur.all(
            "SELECT id FROM openonce_effects WHERE tool = ? AND idempotency_key = ?"
            " AND state <> 'released'",
            (effect.tool, effect.idempotency_key),
        )
        if holder:
            raise ArchiveError(
                f"effect {effect.id}'s key ({effect.tool}) is held by effect {holder[0][0]}"
                " in the ledger now; nothing was imported"
            )
    return False


def _insert_approval(cur: Cursor, effect_id: str, a: dict[str, Any]) -> None:
    """With its original id (the row comes back exactly) unless another approval took that
    number since (SQLite hands out max + 1 again): then with a new one."""
    values = (effect_id, a["decision"], a["by"], a["reason"], a["args_fingerprint"],
              a["at"], a.get("expires_at"))  # fmt: skip
    number = a.get("id")
    if isinstance(number, int) and not cur.all(
        "SELECT 1 FROM openonce_approvals WHERE id = ?", (number,)
    ):
        cur.run(f"INSERT INTO openonce_approvals (id, {APPROVAL_COLUMNS}) VALUES ({marks(8)})",
                (number, *values))  # fmt: skip
    else:
        cur.run(_INSERT_APPROVAL, values)


def _insert_line(cur: Cursor, effect_id: str, line: dict[str, Any]) -> None:
    taken = cur.all("SELECT effect_id FROM openonce_journal WHERE seq = ?", (line["seq"],))
    if taken:
        raise ArchiveError(
            f"journal line {line['seq']} of effect {effect_id} is taken by effect"
            f" {taken[0][0]}; nothing was imported"
        )
    evidence = line.get("evidence")
    cur.run(
        _INSERT_LINE,
        (line["seq"], effect_id, line["at"], line["from_state"], line["to_state"],
         line["actor"], line.get("reason", ""),
         dumps(evidence) if evidence is not None else None,
         line.get("action", "")),
    )  # fmt: skip


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def parse_duration(text: str) -> float:
    """``90d``, ``12h``, ``30m`` or ``45s`` as seconds; ValueError for anything else (a
    bare number is refused: 90 days and 90 seconds are too far apart to guess)."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    value = text.strip().lower()
    scale = units.get(value[-1:])
    try:
        if scale is None:
            raise ValueError
        seconds = float(value[:-1]) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a duration: write 90d, 12h, 30m or 45s") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"{text!r}: a duration must be more than 0")
    if seconds > MAX_AGE:
        raise ValueError(f"{text!r}: a duration must be at most 36500d")
    return seconds
