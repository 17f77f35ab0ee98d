"""The ledger schema, owned and versioned by the core.

Agents use the ledger without Django, so the DDL lives here; ``manage.py migrate`` and
``openonce --db ... migrate`` both install it through ``Store.migrate()``. Each version is
a list of statements applied once, in order, recorded in ``openonce_schema``. Each version
also names the oldest code that may still use a ledger at it (``READABLE_FROM``), so agents
not yet upgraded keep working on a ledger a newer release migrated while the change is
additive (``require_usable``).

Types are written for Postgres and translated for SQLite. Timestamps are epoch seconds
(double precision) so both stores compare and index them the same way.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

SCHEMA_VERSION = 7

log = logging.getLogger("openonce")

# Journal and approvals name their effect without a foreign key: the core is their only
# writer and always writes them in the effect's own transaction, and a foreign key would
# lock the effect row on every journal line of the hot path.
_V1 = [
    """
    CREATE TABLE openonce_effects (
        id text PRIMARY KEY,
        tool text NOT NULL,
        idempotency_key text NOT NULL,
        scope text,
        state text NOT NULL,
        args_json text NOT NULL,
        args_fingerprint text NOT NULL,
        provider_key text NOT NULL,
        attempt integer NOT NULL DEFAULT 0,
        max_attempts integer NOT NULL DEFAULT 1,
        fence bigint NOT NULL DEFAULT 0,
        lease_owner text,
        lease_expires_at double precision,
        approvals_required integer NOT NULL DEFAULT 0,
        approval_ttl double precision,
        execution_status text,
        execution_evidence_json text,
        verification_status text,
        verification_evidence_json text,
        result_json text,
        error_json text,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        waiters integer NOT NULL DEFAULT 0
    )
    """,
    # First writer wins on this index, not on isolation levels or locks in Python.
    # A released (never started) claim steps aside so its key can be claimed anew.
    """
    CREATE UNIQUE INDEX openonce_effects_key_uniq
        ON openonce_effects (tool, idempotency_key) WHERE state <> 'released'
    """,
    # The human queue and the state filters: effects in a state, oldest change first.
    "CREATE INDEX openonce_effects_state_updated ON openonce_effects (state, updated_at, id)",
    # The lease sweep: STARTED effects whose lease ran out.
    """
    CREATE INDEX openonce_effects_lease_due
        ON openonce_effects (lease_expires_at) WHERE state = 'started'
    """,
    # Listing by time (keyset pagination) and by run.
    "CREATE INDEX openonce_effects_created ON openonce_effects (created_at, id)",
    "CREATE INDEX openonce_effects_scope ON openonce_effects (scope, created_at)",
    # The console's filter by tool, newest first (a rare tool must not scan the table).
    "CREATE INDEX openonce_effects_tool ON openonce_effects (tool, created_at, id)",
    # The console's search by idempotency key, whatever the tool.
    "CREATE INDEX openonce_effects_key ON openonce_effects (idempotency_key)",
    """
    CREATE TABLE openonce_journal (
        seq bigserial PRIMARY KEY,
        effect_id text NOT NULL,
        at double precision NOT NULL,
        from_state text,
        to_state text NOT NULL,
        actor text NOT NULL,
        reason text NOT NULL DEFAULT '',
        evidence_json text
    )
    """,
    "CREATE INDEX openonce_journal_effect ON openonce_journal (effect_id, seq)",
    # The operator audit log. Partial, so the agents' lines (nearly all of them) do not
    # pay for it on the hot path.
    """
    CREATE INDEX openonce_journal_operators
        ON openonce_journal (seq) WHERE actor LIKE 'operator:%'
    """,
    """
    CREATE TABLE openonce_approvals (
        id bigserial PRIMARY KEY,
        effect_id text NOT NULL,
        decision text NOT NULL,
        decided_by text NOT NULL,
        reason text NOT NULL DEFAULT '',
        args_fingerprint text NOT NULL,
        at double precision NOT NULL,
        expires_at double precision
    )
    """,
    "CREATE INDEX openonce_approvals_effect ON openonce_approvals (effect_id, id)",
]

# Version 2: the journal names the move of the state table behind each line (so the audit
# log can filter by action and a journal can be replayed through the table); waiting
# duplicates register outside the effects table, so registering is no durable write.
_V2 = [
    "ALTER TABLE openonce_journal ADD COLUMN action text NOT NULL DEFAULT ''",
    "ALTER TABLE openonce_effects DROP COLUMN waiters",
    # The lease sweep finds STARTED effects through (state, updated_at, id): the calls in
    # flight are few, and every claim no longer pays for an index of its own.
    "DROP INDEX IF EXISTS openonce_effects_lease_due",
]
_V2_PG = [
    # UNLOGGED: no WAL, and a commit that touched only this table does not wait for fsync.
    # Lost on a crash, which only costs waiters a one-second re-read.
    """
    CREATE UNLOGGED TABLE openonce_waiters (
        effect_id text NOT NULL,
        token text NOT NULL,
        PRIMARY KEY (effect_id, token)
    )
    """,
]

# The journal is append-only: the database itself refuses to change or delete a line.
_PG_APPEND_ONLY = [
    """
    CREATE FUNCTION openonce_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'openonce: % is append-only', TG_TABLE_NAME;
    END $$
    """,
    """
    CREATE TRIGGER openonce_journal_append_only BEFORE UPDATE OR DELETE ON openonce_journal
        FOR EACH ROW EXECUTE FUNCTION openonce_refuse_change()
    """,
    """
    CREATE TRIGGER openonce_approvals_append_only BEFORE UPDATE OR DELETE ON openonce_approvals
        FOR EACH ROW EXECUTE FUNCTION openonce_refuse_change()
    """,
]

_SQLITE_APPEND_ONLY = [
    f"""
    CREATE TRIGGER {table}_{op.lower()}_refused BEFORE {op} ON {table}
    BEGIN SELECT RAISE(ABORT, 'openonce: {table} is append-only'); END
    """
    for table in ("openonce_journal", "openonce_approvals")
    for op in ("UPDATE", "DELETE")
]

# Version 3: the console's search box (console/selectors.py, ``search``). Postgres only:
# SQLite compares text bytewise, so its existing btrees serve prefix ranges as they are,
# and it has no JSON index (its argument search walks openonce_effects_created).
_V3_SEARCH_PG = [
    # "eff_3f2a" pasted into the search box: effect id prefix (LIKE 'eff_3f2a%'). The
    # primary key's btree follows the database collation, which LIKE cannot use.
    "CREATE INDEX openonce_effects_id_prefix ON openonce_effects (id text_pattern_ops)",
    # Idempotency key, exact or prefix: replaces v1's plain index (equality works on
    # text_pattern_ops too), so the hot path keeps the same number of indexes.
    "DROP INDEX IF EXISTS openonce_effects_key",
    "CREATE INDEX openonce_effects_key ON openonce_effects (idempotency_key text_pattern_ops)",
    # Scope (run id), exact or prefix, newest first: replaces v1's (scope, created_at).
    "DROP INDEX IF EXISTS openonce_effects_scope",
    """
    CREATE INDEX openonce_effects_scope
        ON openonce_effects (scope text_pattern_ops, created_at)
    """,
    # Argument values: JSON containment, args_json::jsonb @> '{"charge": "ch_1"}'.
    # jsonb_path_ops is smaller and faster than the default opclass and serves @> alone.
    """
    CREATE INDEX openonce_effects_args
        ON openonce_effects USING gin ((args_json::jsonb) jsonb_path_ops)
    """,
]

# Version 4: the journal is keyed by (effect_id, seq) instead of seq alone. Lines are read
# by effect, in order (store.journal, the detail page, first_actors, has_journal_line) and
# people's lines by seq (the audit log, on openonce_journal_operators). Nothing looks a
# line up by seq alone, so the old key on seq was a second btree on every line of the hot
# path that no query needed. Postgres only: on SQLite seq is the rowid, which costs no
# index. Adding the key builds its index under a table lock, in one pass over the journal.
_V4_JOURNAL_KEY_PG = [
    "ALTER TABLE openonce_journal DROP CONSTRAINT openonce_journal_pkey",
    "ALTER TABLE openonce_journal ADD CONSTRAINT openonce_journal_pkey"
    " PRIMARY KEY (effect_id, seq)",
    "DROP INDEX IF EXISTS openonce_journal_effect",
]

# Version 5: loops that run all day cost what is pending, not what is history; and the
# retention (openonce_core/_retention.py) may archive old effects.
_V5 = [
    # When an UNKNOWN effect may next be probed, written by the reconciler when it asks
    # again later (a probe that failed, a miss too young to trust): its last change plus
    # the longer of the tool's grace and the backoff. NULL until then: due at its last
    # change plus its tool's grace.
    "ALTER TABLE openonce_effects ADD COLUMN next_probe_at double precision",
    # The sweep's two questions, each answered by an index range of due rows only: UNKNOWN
    # effects never probed, by their last change; UNKNOWN effects in backoff, by their next
    # probe. Partial, so only UNKNOWN rows are in them and the hot path never writes them.
    """
    CREATE INDEX openonce_effects_unknown_fresh ON openonce_effects (updated_at, id)
        WHERE state = 'unknown' AND next_probe_at IS NULL
    """,
    """
    CREATE INDEX openonce_effects_unknown_next ON openonce_effects (next_probe_at, id)
        WHERE state = 'unknown' AND next_probe_at IS NOT NULL
    """,
    # A duplicate of an effect the retention archived: what remains of its key, so the call
    # is refused (it ran, or failed, already) instead of running a second time. Released
    # claims (nothing ran) leave none.
    """
    CREATE TABLE openonce_tombstones (
        tool text NOT NULL,
        idempotency_key text NOT NULL,
        effect_id text NOT NULL,
        state text NOT NULL,
        args_fingerprint text NOT NULL,
        created_at double precision NOT NULL,
        archived_at double precision NOT NULL,
        archive text NOT NULL DEFAULT '',
        PRIMARY KEY (tool, idempotency_key)
    )
    """,
]
_V5_PG = [
    # The notifier's cursor reads ``seq > ? ORDER BY seq``; since v4 no index started with
    # seq, so every tick scanned the journal. A btree on an increasing number costs one
    # insert at its right edge per line. (SQLite: seq is the rowid, already ordered.)
    "CREATE INDEX openonce_journal_seq ON openonce_journal (seq)",
    # Append-only, except for the retention: a transaction that says
    # ``SET LOCAL openonce.retention = 'on'`` may delete (never update) lines and approvals.
    """
    CREATE OR REPLACE FUNCTION openonce_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' AND current_setting('openonce.retention', true) = 'on' THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'openonce: % is append-only', TG_TABLE_NAME;
    END $$
    """,
]
# SQLite has no session settings: the retention inserts a row into openonce_retention_grant
# inside its own transaction and deletes it before committing, so no other connection ever
# sees it, and the delete triggers stand aside only while it is there.
_V5_SQLITE = [
    "CREATE TABLE openonce_retention_grant (token text PRIMARY KEY)",
    *[
        f"DROP TRIGGER IF EXISTS {table}_delete_refused"
        for table in ("openonce_journal", "openonce_approvals")
    ],
    *[
        f"""
    CREATE TRIGGER {table}_delete_refused BEFORE DELETE ON {table}
    WHEN NOT EXISTS (SELECT 1 FROM openonce_retention_grant)
    BEGIN SELECT RAISE(ABORT, 'openonce: {table} is append-only'); END
    """
        for table in ("openonce_journal", "openonce_approvals")
    ],
]

_V6 = [
    # The tools of the UNKNOWN effects never probed (each tool's grace decides when its
    # effects are due), one index probe per tool: ``tool > ? ORDER BY tool LIMIT 1``. Read
    # by the sweep, /metrics and every poll of the console's queue; without it, finding
    # them walked every such effect (600 ms a poll at 20,000 during a provider's outage).
    # Partial like the v5 ones: only UNKNOWN rows, never written by the hot path.
    """
    CREATE INDEX openonce_effects_unknown_fresh_tool ON openonce_effects (tool)
        WHERE state = 'unknown' AND next_probe_at IS NULL
    """,
]

_V7 = [
    # The console finds an archived effect by its id: a link to /effects/<id>/ (a
    # notification, a ticket, an audit note) that names no effect any more answers 410 Gone
    # with where the effect went (console/views.py). Without it each such page read every
    # tombstone. It costs the retention one more index write per archived effect (its
    # tombstone's insert; its later update of the archive's name changes no indexed column);
    # the hot path writes no tombstone, so it never pays for it.
    "CREATE INDEX openonce_tombstones_effect ON openonce_tombstones (effect_id)",
    # Each version row from here on says the oldest code that may use the ledger
    # (READABLE_FROM below). Older code reads only max(version), which this leaves alone.
    "ALTER TABLE openonce_schema ADD COLUMN readable_from integer",
]

# The oldest code (by its SCHEMA_VERSION) that works with a ledger at each version. A
# version that only adds what older code never touches (an index, a table it does not
# read) keeps the figure before it; one that changes what older code reads or writes (a
# column it writes dropped, a NOT NULL column its inserts leave out, a changed trigger or
# meaning) raises it to itself. Code at SCHEMA_VERSION uses a newer ledger whose recorded
# figure is at most SCHEMA_VERSION (require_usable); the figure is written with each
# version row from v7 on. A new version adds its line here, with its reason.
READABLE_FROM = {
    1: 1,
    # Drops openonce_effects.waiters, which v1 code wrote for every waiting duplicate, and
    # gives journal lines an action that v1 code would leave empty (the audit log filters
    # and replays by it).
    2: 2,
    # Indexes only (Postgres). The GIN index reads each new effect's arguments as jsonb;
    # v2 code writes them as v3 code does, so it refuses nothing for v2 it does not for v3.
    3: 2,
    # Re-keys the Postgres journal by (effect_id, seq): seq stays unique (bigserial), the
    # reads by effect use the new key, and nothing in v2 code names the old one.
    4: 2,
    # The retention archives effects and leaves tombstones: older code takes a missing row
    # for "never ran" and would run an archived key again. (Also next_probe_at, which older
    # code would leave stale, and triggers that now let the retention delete.)
    5: 5,
    6: 5,  # an index, on UNKNOWN rows only
    # An index on tombstones, and openonce_schema.readable_from: older code reads only
    # max(version), and inserts a version row only when it migrates, which it does not do
    # to a newer ledger.
    7: 5,
}

# The version that added openonce_schema.readable_from: older ledgers record no figure.
_READERS_RECORDED = 7

SCHEMA_TABLE = {
    "postgres": "CREATE TABLE IF NOT EXISTS openonce_schema"
    " (version integer PRIMARY KEY, applied_at double precision NOT NULL)",
    "sqlite": "CREATE TABLE IF NOT EXISTS openonce_schema"
    " (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)",
}


def _to_sqlite(stmt: str) -> str:
    return (
        # Only the retention deletes from these tables, and only rows below the newest (it
        # keeps recent history), so a rowid is never handed out twice without AUTOINCREMENT.
        stmt.replace("bigserial PRIMARY KEY", "INTEGER PRIMARY KEY")
        .replace("double precision", "REAL")
        .replace("bigint", "INTEGER")
    )


def migrations(dialect: str) -> dict[int, list[str]]:
    """Statements per version for ``dialect`` ("postgres" or "sqlite")."""
    if dialect == "postgres":
        return {
            1: _V1 + _PG_APPEND_ONLY,
            2: _V2 + _V2_PG,
            3: _V3_SEARCH_PG,
            4: _V4_JOURNAL_KEY_PG,
            5: _V5 + _V5_PG,
            6: _V6,
            7: _V7,
        }
    if dialect == "sqlite":
        return {
            1: [_to_sqlite(s) for s in _V1] + _SQLITE_APPEND_ONLY,
            2: [_to_sqlite(s) for s in _V2],
            3: [],  # SQLite's byte-order indexes already serve the console's prefix ranges
            4: [],  # the rowid is seq; (effect_id, seq) is the journal's one index already
            5: [_to_sqlite(s) for s in _V5] + _V5_SQLITE,
            6: _V6,
            7: _V7,
        }
    raise ValueError(f"unknown dialect {dialect!r}")


class Cursor(Protocol):
    def execute(self, sql: str, /) -> Any: ...
    def fetchone(self) -> Any: ...


def current_version(cursor: Cursor) -> int:
    cursor.execute("SELECT max(version) FROM openonce_schema")
    row = cursor.fetchone()
    return (row[0] if row else 0) or 0


def readable_from(cursor: Cursor, version: int) -> int:
    """The oldest code version that may use the ledger at ``version``, as the ledger
    records it; ``version`` itself where it records none (older than v7, or not said)."""
    if version < _READERS_RECORDED:
        return version
    cursor.execute(f"SELECT readable_from FROM openonce_schema WHERE version = {int(version)}")
    row = cursor.fetchone()
    return row[0] if row and row[0] is not None else version


def version_row(version: int, applied_at: float) -> str:
    """The statement that records ``version`` as applied (with its oldest reader from v7)."""
    if version < _READERS_RECORDED:
        return (
            f"INSERT INTO openonce_schema (version, applied_at) VALUES ({version}, {applied_at!r})"
        )
    return (
        "INSERT INTO openonce_schema (version, applied_at, readable_from)"
        f" VALUES ({version}, {applied_at!r}, {READABLE_FROM[version]})"
    )


class _SchemaSource(Protocol):
    def schema_version(self) -> int: ...
    def schema_readable_from(self) -> int: ...


def require_usable_store(store: _SchemaSource) -> None:
    """``require_usable`` for a store: asks for the oldest reader only of a newer ledger."""
    version = store.schema_version()
    if version > SCHEMA_VERSION:
        require_usable(version, store.schema_readable_from())
    else:
        require_usable(version, version)


def require_usable(version: int, oldest_reader: int) -> None:
    """Refuse a ledger this code cannot use, with what to do about it.

    An older ledger (a new file never migrated, or one an older OpenOnce left) is refused:
    this code may rely on what the migrations add, so migrate it. A newer one is used when
    it records this code's version or an older one as its oldest reader (what the versions
    in between changed, older code never touches); otherwise only a newer OpenOnce can use
    it, which no migration gives."""
    from .errors import SchemaVersionError

    if version < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"ledger schema is at version {version}, this OpenOnce needs {SCHEMA_VERSION};"
            " run `openonce --db DSN migrate`",
            ledger_version=version,
        )
    if version == SCHEMA_VERSION:
        return
    if oldest_reader > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"ledger schema is at version {version} and this OpenOnce is at {SCHEMA_VERSION}:"
            f" the ledger needs OpenOnce at {oldest_reader} or newer, so upgrade OpenOnce"
            " here (pip install --upgrade openonce); migrating cannot help",
            ledger_version=version,
            needs_upgrade=True,
        )
    # Said once per client built (in practice once per process): nothing is wrong, but an
    # operator should know this code lags the ledger before a version that raises the bar.
    log.info(
        "ledger schema is at version %d and this OpenOnce is at %d: it uses the ledger as"
        " it is (the ledger takes OpenOnce at %d or newer); upgrade it in good time",
        version,
        SCHEMA_VERSION,
        oldest_reader,
    )


def apply(cursor: Cursor, dialect: str) -> tuple[int, int]:
    """Bring the ledger schema up to SCHEMA_VERSION through ``cursor``, inside the caller's
    transaction. Returns (version before, version after). Used by the stores' ``migrate``
    and by Django's ``manage.py migrate``, so both install exactly the same tables.

    A ledger a newer OpenOnce already migrated is left as it is when this code can still
    use it (an older console's ``migrate`` at its deploy must not fail, nor undo anything):
    then the version after is the ledger's own, above SCHEMA_VERSION. When this code cannot
    use it, SchemaVersionError says to upgrade OpenOnce."""
    cursor.execute(SCHEMA_TABLE[dialect])
    before = current_version(cursor)
    if before > SCHEMA_VERSION:
        require_usable(before, readable_from(cursor, before))
        return before, before
    for version, statements in sorted(migrations(dialect).items()):
        if version > before:
            for stmt in statements:
                cursor.execute(stmt)
            cursor.execute(version_row(version, time.time()))
    return before, SCHEMA_VERSION
