"""The effect state machine: which states exist and which moves between them are legal."""

from __future__ import annotations

from enum import StrEnum


class EffectState(StrEnum):
    PLANNED = "planned"  # eligible to start (a re-armed effect waits here for its caller)
    REQUIRES_APPROVAL = "requires_approval"
    APPROVED = "approved"
    DENIED = "denied"
    STARTED = "started"  # claimed: the handler may be running; lease + fence held
    RECEIPT_RECORDED = "receipt_recorded"  # a receipt awaits its contract check
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    HUMAN_REVIEW = "human_review"
    CANCELLED = "cancelled"
    RELEASED = "released"  # an unstarted claim given up; its key may be claimed anew


S = EffectState

# Terminal states replay to duplicates and never move again.
TERMINAL = frozenset({S.COMMITTED, S.FAILED, S.DENIED, S.CANCELLED, S.RELEASED})
# States a person has to look at.
NEEDS_HUMAN = frozenset({S.REQUIRES_APPROVAL, S.HUMAN_REVIEW, S.UNKNOWN})
# States in which nothing has been sent yet for the current attempt.
NOT_STARTED = frozenset({S.PLANNED, S.REQUIRES_APPROVAL, S.APPROVED})

LEGAL: dict[EffectState, frozenset[EffectState]] = {
    S.PLANNED: frozenset({S.STARTED, S.REQUIRES_APPROVAL, S.CANCELLED, S.RELEASED, S.HUMAN_REVIEW}),
    S.REQUIRES_APPROVAL: frozenset(
        {S.APPROVED, S.REQUIRES_APPROVAL, S.DENIED, S.CANCELLED, S.RELEASED}
    ),
    S.APPROVED: frozenset({S.STARTED, S.REQUIRES_APPROVAL, S.DENIED, S.CANCELLED, S.RELEASED}),
    S.STARTED: frozenset(
        {S.COMMITTED, S.FAILED, S.UNKNOWN, S.STARTED, S.RECEIPT_RECORDED, S.HUMAN_REVIEW}
    ),
    S.RECEIPT_RECORDED: frozenset({S.COMMITTED, S.HUMAN_REVIEW}),
    S.UNKNOWN: frozenset({S.UNKNOWN, S.RECEIPT_RECORDED, S.COMMITTED, S.PLANNED, S.HUMAN_REVIEW}),
    S.HUMAN_REVIEW: frozenset({S.RECEIPT_RECORDED, S.COMMITTED, S.PLANNED}),
}


def is_legal(src: EffectState, dst: EffectState) -> bool:
    return dst in LEGAL.get(src, frozenset())
