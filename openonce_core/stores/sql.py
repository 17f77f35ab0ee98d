"""Row mapping shared by the SQL stores: one column list, one conversion each way."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..canonical import dumps
from ..records import Approval, Effect, JournalEntry
from ..states import EffectState

# Effect field -> column, in table order. JSON-valued fields are stored as text.
JSON_FIELDS = frozenset({"args", "execution_evidence", "verification_evidence", "result", "error"})
FIELDS = [
    "id",
    "tool",
    "idempotency_key",
    "scope",
    "state",
    "args",
    "args_fingerprint",
    "provider_key",
    "attempt",
    "max_attempts",
    "fence",
    "lease_owner",
    "lease_expires_at",
    "approvals_required",
    "approval_ttl",
    "execution_status",
    "execution_evidence",
    "verification_status",
    "verification_evidence",
    "result",
    "error",
    "created_at",
    "updated_at",
]


# What a newly claimed effect can carry; evidence and outcomes only arrive by update, so
# the claim's INSERT leaves them to their NULL defaults (fewer parameters on the hot path).
NEW_FIELDS = [
    f
    for f in FIELDS
    if f
    not in (
        "execution_status", "execution_evidence", "verification_status",
        "verification_evidence", "result", "error",
    )
]  # fmt: skip


# Rows are turned into Effects positionally: the two orders must agree.
assert [f.name for f in dataclasses.fields(Effect)] == FIELDS


def column(field: str) -> str:
    return field + "_json" if field in JSON_FIELDS else field


COLUMNS = [column(f) for f in FIELDS]
SELECT_COLUMNS = ", ".join(COLUMNS)
JOURNAL_COLUMNS = "effect_id, at, from_state, to_state, actor, reason, evidence_json"
APPROVAL_COLUMNS = "effect_id, decision, decided_by, reason, args_fingerprint, at, expires_at"


def to_db(field: str, value: Any) -> Any:
    if field in JSON_FIELDS:
        return None if value is None else dumps(value)
    if field == "state":
        return str(value)
    return value


def new_effect_row(effect: Effect) -> list[Any]:
    return [to_db(f, getattr(effect, f)) for f in NEW_FIELDS]


NEW_COLUMNS = [column(f) for f in NEW_FIELDS]


_JSON_POSITIONS = frozenset(i for i, f in enumerate(FIELDS) if f in JSON_FIELDS)
_STATE_POSITION = FIELDS.index("state")
_loads = json.loads
_STATES = {str(s): s for s in EffectState}


def effect_from_row(row: Any) -> Effect:
    # On every replay: positional, no intermediate dict.
    values = [
        (_loads(v) if v is not None else None) if i in _JSON_POSITIONS else v
        for i, v in enumerate(row)
    ]
    values[_STATE_POSITION] = _STATES[str(values[_STATE_POSITION])]
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
    ]


def journal_from_row(row: Any) -> JournalEntry:
    seq, effect_id, at, from_state, to_state, actor, reason, evidence = row
    return JournalEntry(
        effect_id=effect_id,
        from_state=from_state,
        to_state=to_state,
        actor=actor,
        reason=reason,
        evidence=json.loads(evidence) if evidence is not None else None,
        at=at,
        seq=seq,
    )


def approval_row(a: Approval) -> list[Any]:
    return [a.effect_id, a.decision, a.by, a.reason, a.args_fingerprint, a.at, a.expires_at]


def approval_from_row(row: Any) -> Approval:
    effect_id, decision, by, reason, fp, at, expires_at = row
    return Approval(effect_id, decision, by, reason, fp, at, expires_at)
