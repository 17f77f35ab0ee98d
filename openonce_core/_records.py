"""The ledger's records as the core sees them: an effect, a journal entry, an approval."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from ._states import EffectState


def now() -> float:
    """This host's clock; the core itself takes its time from its Clock (clock.py)."""
    return time.time()


def new_effect_id() -> str:
    """``eff_`` + 32 random hex digits: any prefix a person copies from the console (it
    shows the first 15 characters) tells effects apart."""
    return "eff_" + os.urandom(16).hex()


# Not frozen only because a frozen __init__ costs more than the rest of a SQLite replay;
# the core never mutates an Effect, it builds a new one with dataclasses.replace.
@dataclass(slots=True)
class Effect:
    id: str
    tool: str
    idempotency_key: str
    scope: str | None
    state: EffectState
    args: dict[str, Any]  # as stored: secret fields replaced by their digests
    args_fingerprint: str
    provider_key: str
    attempt: int = 0
    max_attempts: int = 1
    fence: int = 0  # bumped by every change; writers must name the one they read
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    approvals_required: int = 0
    approval_ttl: float | None = None
    execution_status: str | None = None
    execution_evidence: dict[str, Any] | None = None
    verification_status: str | None = None
    verification_evidence: dict[str, Any] | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=now)
    updated_at: float = field(default_factory=now)
    # When an UNKNOWN effect may next be probed, once the reconciler asked again later (a
    # failed probe's backoff, a young miss); None: at its last change plus its tool's grace
    # (openonce_core/_due.py). Every move clears it unless the move sets a new one.
    next_probe_at: float | None = None


@dataclass(frozen=True, slots=True)
class JournalEntry:
    effect_id: str
    from_state: str | None
    to_state: str
    actor: str  # "agent:<owner>", "operator:<name>", "reconciler", ...
    reason: str = ""
    evidence: dict[str, Any] | None = None
    at: float = field(default_factory=now)
    seq: int | None = None  # assigned by the store, orders the journal
    action: str = ""  # the move of openonce_core._states.MOVES that wrote this line


@dataclass(frozen=True, slots=True)
class Approval:
    effect_id: str
    decision: str  # "approve" | "deny"
    by: str
    reason: str
    args_fingerprint: str
    at: float = field(default_factory=now)
    expires_at: float | None = None

    def valid_for(self, fingerprint: str, at: float) -> bool:
        return (
            self.decision == "approve"
            and self.args_fingerprint == fingerprint
            and (self.expires_at is None or self.expires_at > at)
        )
