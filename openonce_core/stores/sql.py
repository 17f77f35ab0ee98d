"""What the SQL stores share: the row mapping, every read query, and the write rules.

Queries are written once, with ``?`` placeholders; the Postgres store runs them with
``%s``. Only what the dialects really do differently lives in sqlite.py and postgres.py:
connections, transactions, and how a write and its journal lines become one commit.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .._canonical import dumps
from .._clock import Clock
from .._records import Approval, Effect, JournalEntry
from .._states import EffectState
from ._wake import WakeBoard

# Effect field -> column, in table order. JSON-valued fields are stored as text.
JSON_FIELDS = frozenset({"args", "execution_evidence", "verification_evidence", "result", "error"})
FIELDS = [f.name for f in dataclasses.fields(Effect)]

# What a newly claimed effect can carry; evidence, outcomes and a next probe time only
# arrive by update, so the claim's INSERT leaves them to their NULL defaults (fewer
# parameters on the hot path).
NEW_FIELDS = [
    f
    for f in FIELDS
    if f
    not in (
        "execution_status", "execution_evidence", "verification_status",
        "verification_evidence", "result", "error", "next_probe_at",
    )
]  # fmt: skip


def column(field: str) -> str:
    return field + "_json" if field in JSON_FIELDS else field


COLUMNS = [column(f) for f in FIELDS]
SELECT_COLUMNS = ", ".join(COLUMNS)
NEW_COLUMNS = [column(f) for f in NEW_FIELDS]
JOURNAL_COLUMNS = "effect_id, at, from_state, to_state, actor, reason, evidence_json, action"
APPROVAL_COLUMNS = "effect_id, decision, decided_by, reason, args_fingerprint, at, expires_at"
# What a key's tombstone holds (openonce_core/_retention.py), in ``Tombstone``'s order.
TOMBSTONE_COLUMNS = "effect_id, state, args_fingerprint, created_at, archived_at, archive"

# A replay needs only these: whether the effect is settled, whether the call matches it,
# and what to hand back. Everything else is read only when the effect is not settled.
REPLAY_COLUMNS = "id, state, args_fingerprint, result_json, error_json, execution_evidence_json"


class ReplayRow(NamedTuple):
    """The lean row a duplicate call reads first (JSON still as text)."""

    id: str
    state: str
    args_fingerprint: str
    result_json: str | None
    error_json: str | None
    execution_evidence_json: str | None


# Every replay's read (a constant: built once, and its text hashed once).
FIND_REPLAY = (
    f"SELECT {REPLAY_COLUMNS} FROM openonce_effects"
    " WHERE idempotency_key = ? AND tool = ? AND state <> 'released'"
)
_replay_row = ReplayRow._make


def to_db(field: str, value: Any) -> Any:
    if field in JSON_FIELDS:
        return None if value is None else dumps(value)
    if field == "state":
        return str(value)
    return value


def change_params(changes: dict[str, Any]) -> list[Any]:
    """``to_db`` of every change, in order: a move's SET values (one comprehension, not a
    call per field, on every finish)."""
    return [
        (None if v is None else dumps(v)) if f in JSON_FIELDS else str(v) if f == "state" else v
        for f, v in changes.items()
    ]


_NEW_JSON = [f in JSON_FIELDS for f in NEW_FIELDS]
_STATE_AT = NEW_FIELDS.index("state")


def new_effect_row(effect: Effect) -> list[Any]:
    # On every new effect: the one JSON field a claim carries is its arguments.
    row = [getattr(effect, f) for f in NEW_FIELDS]
    for i, is_json in enumerate(_NEW_JSON):
        if is_json and row[i] is not None:
            row[i] = dumps(row[i])
    row[_STATE_AT] = str(row[_STATE_AT])
    return row


_JSON_POSITIONS = frozenset(i for i, f in enumerate(FIELDS) if f in JSON_FIELDS)
_STATE_POSITION = FIELDS.index("state")
_loads = json.loads
STATES = {str(s): s for s in EffectState}


def effect_from_row(row: Any) -> Effect:
    values = [
        (_loads(v) if v is not None else None) if i in _JSON_POSITIONS else v
        for i, v in enumerate(row)
    ]
    values[_STATE_POSITION] = STATES[str(values[_STATE_POSITION])]
    return Effect(*values)  # type: ignore[arg-type]


def journal_row(entry: JournalEntry) -> list[Any]:
    return [
        entry.effect_id,
        entry.at,
        entry.from_state,
        entry.to_state,
        entry.actor,
        entry.reason,
        dumps(entry.evidence) if entry.evidence is not None else None,
        entry.action,
    ]


def journal_from_row(row: Any) -> JournalEntry:
    seq, effect_id, at, from_state, to_state, actor, reason, evidence, action = row
    return JournalEntry(
        effect_id=effect_id,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        reason=reason,
        evidence=json.loads(evidence) if evidence is not None else None,
        at=at,
        seq=seq,
        action=action,
    )


def approval_row(a: Approval) -> list[Any]:
    return [a.effect_id, a.decision, a.by, a.reason, a.args_fingerprint, a.at, a.expires_at]


def approval_from_row(row: Any) -> Approval:
    effect_id, decision, by, reason, fp, at, expires_at = row
    return Approval(effect_id, decision, by, reason, fp, at, expires_at)


def json_name(name: str) -> str:
    """A JSON field name that may be written into a query's text: letters, digits, '_'."""
    if not _JSON_NAME.fullmatch(name):
        raise ValueError(f"not a plain field name: {name!r}")
    return name


_JSON_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# What a loose comparison trims: the same characters in Python and in both databases.
LOOSE_TRIM = " \t\r\n"


def loose_text(value: str | int) -> str:
    """``value`` as a loose identity comparison sees it (``SQLStore.committed_receipts_naming``)."""
    if isinstance(value, int):
        return str(value).lstrip("#0")
    return value.strip(LOOSE_TRIM).translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def marks(n: int) -> str:
    return ", ".join("?" * n)


# -- the write rules, stated once for every store --------------------------------------------


# A fenced change: it applies only if the effect is still in a state the writer read, under
# the fence the writer read. Whoever loses reads again and decides again.
def update_statement(fields: Sequence[str], n_states: int) -> str:
    sets = ", ".join(f"{column(f)} = ?" for f in fields)
    return (
        f"UPDATE openonce_effects SET {sets}"
        f" WHERE id = ? AND state IN ({marks(n_states)}) AND fence = ?"
    )


# A probe claim: an UNKNOWN effect may be probed by ``owner`` until ``until`` unless someone
# else's claim on it is still live (or the caller may take over that someone's claim: a
# redelivered batch resuming its own). It bumps the fence, so a decision made on what was
# read before the claim cannot land after it. Not a state change: no journal line.
def claim_statement(n_ids: int, n_steal: int, with_fence: bool) -> str:
    steal = marks(n_steal) or "NULL"
    return (
        "UPDATE openonce_effects SET lease_owner = ?, lease_expires_at = ?, fence = fence + 1"
        f" WHERE id IN ({marks(n_ids)}) AND state = 'unknown'"
        f" AND (lease_expires_at IS NULL OR lease_expires_at <= ? OR lease_owner IN ({steal}))"
        + (" AND fence = ?" if with_fence else "")
        + " RETURNING id"
    )


def claim_params(
    effect_ids: Sequence[str],
    owner: str,
    until: float,
    at: float,
    steal_from: Sequence[str],
    expect_fence: int | None,
) -> list[Any]:
    params: list[Any] = [owner, until, *effect_ids, at, *steal_from]
    if expect_fence is not None:
        params.append(expect_fence)
    return params


# A lease renewal (the heartbeat of a running handler): only the owner of the claim it
# read, with the fence it read, may push the lease out; anyone who took the effect over
# bumped the fence, so a renewal after that changes nothing and tells the owner it lost.
RENEW = (
    "UPDATE openonce_effects SET lease_expires_at = ?"
    " WHERE id = ? AND state = 'started' AND fence = ? AND lease_owner = ?"
)

INSERT_JOURNAL = f"INSERT INTO openonce_journal ({JOURNAL_COLUMNS}) VALUES ({marks(8)})"
INSERT_APPROVAL = f"INSERT INTO openonce_approvals ({APPROVAL_COLUMNS}) VALUES ({marks(7)})"


# One grace window's cutoff: UNKNOWN effects of these tools (None: of every tool) that
# changed at or before ``changed_by`` are past their grace.
class Cutoff(NamedTuple):
    changed_by: float
    tools: tuple[str, ...] | None = None


def _fresh_where(cutoffs: Sequence[Cutoff]) -> tuple[str, list[Any]]:
    # The range (updated_at up to the latest cutoff) comes from the index; each tool's own
    # cutoff is checked on the rows in it, so only due rows leave the database.
    params: list[Any] = [max(c.changed_by for c in cutoffs)]
    per_tool = []
    for cutoff in cutoffs:
        if cutoff.tools is None:
            per_tool.append("updated_at <= ?")
            params.append(cutoff.changed_by)
        else:
            per_tool.append(f"(updated_at <= ? AND tool IN ({marks(len(cutoff.tools))}))")
            params += [cutoff.changed_by, *cutoff.tools]
    return (
        "state = 'unknown' AND next_probe_at IS NULL AND updated_at <= ?"
        f" AND ({' OR '.join(per_tool)})",
        params,
    )


_BACKOFF_WHERE = "state = 'unknown' AND next_probe_at IS NOT NULL AND next_probe_at <= ?"
FRESH_INDEX = "openonce_effects_unknown_fresh"  # schema v5
FRESH_TOOL_INDEX = "openonce_effects_unknown_fresh_tool"  # schema v6
NEXT_INDEX = "openonce_effects_unknown_next"


class SQLStore:
    """The reads every SQL store shares. Subclasses provide ``_one`` and ``_all`` (run a
    read with ``?`` placeholders) and the writes."""

    dialect: str
    clock: Clock
    board: WakeBoard

    def _one(self, query: str, params: Sequence[Any]) -> Any:
        raise NotImplementedError

    def _all(self, query: str, params: Sequence[Any]) -> list[Any]:
        raise NotImplementedError

    # -- effects --------------------------------------------------------------------------

    def get(self, effect_id: str) -> Effect | None:
        row = self._one(f"SELECT {SELECT_COLUMNS} FROM openonce_effects WHERE id = ?", (effect_id,))
        return effect_from_row(row) if row else None

    def find(self, tool: str, idempotency_key: str) -> Effect | None:
        row = self._one(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects"
            " WHERE idempotency_key = ? AND tool = ? AND state <> 'released'",
            (idempotency_key, tool),
        )
        return effect_from_row(row) if row else None

    def find_replay(self, tool: str, idempotency_key: str) -> ReplayRow | None:
        row = self._one(FIND_REPLAY, (idempotency_key, tool))
        return _replay_row(row) if row else None

    def get_many(self, effect_ids: Sequence[str]) -> list[Effect]:
        if not effect_ids:
            return []
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects WHERE id IN ({marks(len(effect_ids))})",
            list(effect_ids),
        )
        return [effect_from_row(r) for r in rows]

    def list_effects(self, states: Iterable[str] | None = None, limit: int = 100) -> list[Effect]:
        if states is None:
            rows = self._all(
                f"SELECT {SELECT_COLUMNS} FROM openonce_effects ORDER BY created_at, id LIMIT ?",
                (limit,),
            )
        else:
            wanted = [str(s) for s in states]
            rows = self._all(
                f"SELECT {SELECT_COLUMNS} FROM openonce_effects"
                f" WHERE state IN ({marks(len(wanted))}) ORDER BY created_at, id LIMIT ?",
                (*wanted, limit),
            )
        return [effect_from_row(r) for r in rows]

    def expired_leases(self, at: float, limit: int = 100) -> list[Effect]:
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'started' AND lease_expires_at <= ?"
            " ORDER BY lease_expires_at LIMIT ?",
            (at, limit),
        )
        return [effect_from_row(r) for r in rows]

    def started_by(self, owner_prefix: str, limit: int = 100) -> list[Effect]:
        """STARTED effects whose lease owner starts with ``owner_prefix`` (one host's)."""
        pattern = owner_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'started' AND lease_owner LIKE ? ESCAPE '\\'"
            " ORDER BY updated_at LIMIT ?",
            (pattern + "%", limit),
        )
        return [effect_from_row(r) for r in rows]

    # -- what is due (openonce_core/_due.py says when; these find it by index) --------------
    # Each WHERE repeats its partial index's predicate word for word, so that both planners
    # (and Postgres's generic plans) can use the index whatever the parameters.

    def _effects_by(self, index: str) -> str:
        """The effects table, read through ``index``. SQLite without statistics prefers
        (state, updated_at, id) for ``state = 'unknown'``, a range over every UNKNOWN row
        (those in backoff too), so it is told; a query the index cannot serve then fails
        instead of scanning. Postgres picks the partial index by itself."""
        if self.dialect in ("sqlite", "memory"):
            return f"openonce_effects INDEXED BY {index}"
        return "openonce_effects"

    def fresh_unknown_tools(self) -> list[str]:
        """The tools of UNKNOWN effects never asked again later: whose grace applies.

        One index probe per tool (the partial index on their tool, a skip scan by hand):
        the cost follows the number of tools, not of effects. 20,000 UNKNOWN effects of a
        provider that is down are two statements, not forty pages."""
        tools: list[str] = []
        source = self._effects_by(FRESH_TOOL_INDEX)
        while True:
            after = " AND tool > ?" if tools else ""
            rows = self._all(
                f"SELECT tool FROM {source} WHERE state = 'unknown' AND next_probe_at IS NULL"
                f"{after} ORDER BY tool LIMIT 1",
                tools[-1:],
            )
            if not rows:
                return tools
            tools.append(str(rows[0][0]))

    def fresh_unknown(
        self, cutoffs: Sequence[Cutoff], limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        """UNKNOWN effects never asked again later that changed by their tool's cutoff
        (its grace before now), by last change: a range of openonce_effects_unknown_fresh."""
        if not cutoffs:
            return []
        where, params = _fresh_where(cutoffs)
        start = after or (float("-inf"), "")
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM {self._effects_by(FRESH_INDEX)} WHERE {where}"
            " AND (updated_at, id) > (?, ?) ORDER BY updated_at, id LIMIT ?",
            (*params, *start, limit),
        )
        return [effect_from_row(r) for r in rows]

    def count_fresh_unknown(self, cutoffs: Sequence[Cutoff]) -> int:
        if not cutoffs:
            return 0
        where, params = _fresh_where(cutoffs)
        query = f"SELECT count(*) FROM {self._effects_by(FRESH_INDEX)} WHERE {where}"
        return int(self._one(query, params)[0])

    def backoff_unknown(
        self, at: float, limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        """UNKNOWN effects whose next probe time (``next_probe_at``) is ``at`` or before, by
        that time: a range of openonce_effects_unknown_next."""
        start = after or (float("-inf"), "")
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM {self._effects_by(NEXT_INDEX)} WHERE {_BACKOFF_WHERE}"
            " AND (next_probe_at, id) > (?, ?) ORDER BY next_probe_at, id LIMIT ?",
            (at, *start, limit),
        )
        return [effect_from_row(r) for r in rows]

    def count_backoff_unknown(self, at: float) -> int:
        query = f"SELECT count(*) FROM {self._effects_by(NEXT_INDEX)} WHERE {_BACKOFF_WHERE}"
        return int(self._one(query, (at,))[0])

    def unknown_changed_after(
        self, at: float, limit: int, after: tuple[float, str] | None = None
    ) -> list[Effect]:
        """UNKNOWN effects that changed after ``at``: written by a clock that has since
        stepped back. None, normally: an empty range of openonce_effects_state_updated."""
        start = after or (at, "")
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects"
            " WHERE state = 'unknown' AND updated_at > ? AND (updated_at, id) > (?, ?)"
            " ORDER BY updated_at, id LIMIT ?",
            (at, *start, limit),
        )
        return [effect_from_row(r) for r in rows]

    def count(self, states: Iterable[str]) -> int:
        wanted = [str(s) for s in states]
        row = self._one(
            f"SELECT count(*) FROM openonce_effects WHERE state IN ({marks(len(wanted))})",
            wanted,
        )
        return int(row[0])

    def count_by_state(self) -> dict[str, int]:
        rows = self._all("SELECT state, count(*) FROM openonce_effects GROUP BY state", ())
        return {str(state): int(n) for state, n in rows}

    def oldest_change(self, state: str) -> float | None:
        row = self._one("SELECT min(updated_at) FROM openonce_effects WHERE state = ?", (state,))
        return row[0] if row else None

    def committed_receipts_naming(
        self,
        tool_prefix: str,
        field: str,
        value: str | int,
        scope: Sequence[tuple[str, Any]] = (),
        *,
        exclude: str = "",
        limit: int = 5,
        loose: bool = False,
    ) -> list[Effect]:
        """COMMITTED effects, other than ``exclude``, whose receipt's top-level ``field``
        equals ``value`` as JSON (7 is not "7"), whose tool starts with ``tool_prefix`` and
        whose arguments hold each ``(name, value)`` of ``scope``: which effect already
        holds a provider object a person's receipt names. The caller matches the tool glob.

        ``loose`` compares as an identity must, where a miss would commit one object
        twice: text ignoring surrounding whitespace and ASCII case (GitHub's ``Acme/API``
        is ``acme/api``), and a number also as text written ``"7"``, ``"#7"`` or
        ``"007"`` (a handler's receipt may hold a PR number so).

        The state, the tool and the JSON comparison all run in the database; no index
        serves the JSON field yet, so the database reads the committed rows of the tool
        (SQLite: through the tool index; Postgres: LIKE under a non-C collation cannot)."""
        conditions = ["state = 'committed'", "id <> ?"]
        params: list[Any] = [exclude]
        for column_name, name, wanted in [("result_json", field, value)] + [
            ("args_json", n, v) for n, v in scope
        ]:
            condition, bound = (
                self._json_field_like(column_name, name, wanted)
                if loose
                else self._json_field_is(column_name, name, wanted)
            )
            conditions.append(condition)
            params.extend(bound)
        if tool_prefix:
            condition, bound = self._tool_starts_with(tool_prefix)
            conditions.append(condition)
            params.extend(bound)
        rows = self._all(
            f"SELECT {SELECT_COLUMNS} FROM openonce_effects WHERE {' AND '.join(conditions)}"
            " ORDER BY created_at, id LIMIT ?",
            (*params, limit),
        )
        return [effect_from_row(r) for r in rows]

    def _json_field_is(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        """A condition (and its parameters): top-level ``name`` of the JSON in ``column``
        is ``value``, of the same JSON type. Each dialect says it its own way, in the form
        an expression index on that field would serve."""
        raise NotImplementedError

    def _json_field_like(self, column: str, name: str, value: str | int) -> tuple[str, list[Any]]:
        """A condition: top-level ``name`` of the JSON in ``column`` names ``value`` as an
        identity (``loose`` above): the field's text, trimmed, is ``loose_text(value)``,
        lower-cased for text, without leading '#' and '0' for a number."""
        raise NotImplementedError

    def _tool_starts_with(self, prefix: str) -> tuple[str, list[Any]]:
        """A condition (and its parameters): the tool starts with ``prefix``."""
        raise NotImplementedError

    # -- journal and approvals --------------------------------------------------------------

    def journal(self, effect_id: str) -> list[JournalEntry]:
        rows = self._all(
            f"SELECT seq, {JOURNAL_COLUMNS} FROM openonce_journal WHERE effect_id = ? ORDER BY seq",
            (effect_id,),
        )
        return [journal_from_row(r) for r in rows]

    def approvals(self, effect_id: str) -> list[Approval]:
        rows = self._all(
            f"SELECT {APPROVAL_COLUMNS} FROM openonce_approvals WHERE effect_id = ? ORDER BY id",
            (effect_id,),
        )
        return [approval_from_row(r) for r in rows]

    def has_journal_line(self, entry: JournalEntry) -> bool:
        """Whether this exact line was written (after a write whose reply was lost)."""
        row = self._one(
            "SELECT 1 FROM openonce_journal"
            " WHERE effect_id = ? AND at = ? AND to_state = ? AND actor = ?",
            (entry.effect_id, entry.at, entry.to_state, entry.actor),
        )
        return row is not None

    # -- the retention's tombstones (openonce_core/_retention.py) ------------------------------

    def tombstone(self, tool: str, idempotency_key: str) -> Any:
        """The key's tombstone (``TOMBSTONE_COLUMNS``), or None."""
        return self._one(
            f"SELECT {TOMBSTONE_COLUMNS} FROM openonce_tombstones"
            " WHERE tool = ? AND idempotency_key = ?",
            (tool, idempotency_key),
        )
