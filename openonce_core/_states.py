"""The effect state machine: the one table of states and of the moves between them.

Every write of ledger state goes through :class:`openonce_core._ledger.Ledger`, which checks
each move against :data:`MOVES` before it touches the store; the console offers a person
exactly :func:`decisions_allowed` for the state on screen; the tests replay journals through
:func:`check_move`. Change what is legal here and nowhere else (ARCHITECTURE.md, "the state
table").

A move is named by its action, which the journal records beside the two states. Two moves
never rest in RECEIPT_RECORDED: a receipt from a probe, a person or a contract-checked
handler is journaled as ``... -> receipt_recorded`` and ``receipt_recorded -> committed``
(or ``-> human_review``) in the same commit, so the journal shows the receipt and the
verdict on it as two lines while the effect row goes straight to the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EffectState(StrEnum):
    PLANNED = "planned"  # eligible to start (a re-armed effect waits here for its caller)
    REQUIRES_APPROVAL = "requires_approval"
    APPROVED = "approved"
    DENIED = "denied"
    STARTED = "started"  # claimed: the handler may be running; lease + fence held
    RECEIPT_RECORDED = "receipt_recorded"  # only in the journal: a receipt before its check
    COMMITTED = "committed"
    FAILED = "failed"
    UNKNOWN = "unknown"
    HUMAN_REVIEW = "human_review"
    CANCELLED = "cancelled"
    RELEASED = "released"  # an unstarted claim given up; its key may be claimed anew


S = EffectState

# Duplicates of these get the recorded outcome. They change again only when later evidence
# contradicts them (a late result of an earlier attempt: ``contradict`` -> HUMAN_REVIEW).
TERMINAL = frozenset({S.COMMITTED, S.FAILED, S.DENIED, S.CANCELLED, S.RELEASED})
# States a person has to look at.
NEEDS_HUMAN = frozenset({S.REQUIRES_APPROVAL, S.HUMAN_REVIEW, S.UNKNOWN})
# States in which nothing has been sent yet for the current attempt.
NOT_STARTED = frozenset({S.PLANNED, S.REQUIRES_APPROVAL, S.APPROVED})
# What a person's decision or a probe may find already resolved, or the outcome is unknown.
UNRESOLVED = frozenset({S.UNKNOWN, S.HUMAN_REVIEW})


@dataclass(frozen=True)
class Move:
    action: str
    sources: frozenset[EffectState]
    targets: frozenset[EffectState]
    by: str  # who makes it: "agent", "openonce", "reconciler", "operator", "anyone"
    meaning: str
    creates: bool = False  # the first line of a new effect (the row did not exist)
    decision: bool = False  # a person's decision, offered by the console

    def allows(self, src: EffectState, dst: EffectState) -> bool:
        return src in self.sources and dst in self.targets


def _move(
    action: str,
    sources: set[EffectState] | frozenset[EffectState],
    targets: set[EffectState] | frozenset[EffectState],
    by: str,
    meaning: str,
    **flags: bool,
) -> Move:
    return Move(action, frozenset(sources), frozenset(targets), by, meaning, **flags)


_EVERY_STATE = frozenset(S)
_CAN_BE_CONTRADICTED = _EVERY_STATE - {S.HUMAN_REVIEW, S.RECEIPT_RECORDED, S.RELEASED}

MOVES: dict[str, Move] = {
    m.action: m
    for m in (
        # -- the agent's call path ---------------------------------------------------------
        _move("claim", {S.PLANNED}, {S.STARTED}, "agent",
              "the first call claims the effect (lease and fence) before its handler runs",
              creates=True),
        _move("request_approval", {S.PLANNED}, {S.REQUIRES_APPROVAL}, "agent",
              "the policy asks a person before the first call may run", creates=True),
        _move("start", {S.PLANNED, S.APPROVED}, {S.STARTED}, "agent",
              "an approved or re-armed effect runs when its caller calls again"),
        _move("retry", {S.STARTED}, {S.STARTED}, "agent",
              "nothing was sent (a retryable error); the next attempt runs under a new fence"),
        _move("finish", {S.STARTED}, {S.COMMITTED, S.FAILED, S.UNKNOWN, S.RECEIPT_RECORDED},
              "agent", "the attempt's own outcome: returned, refused, or may have happened"),
        _move("check_receipt", {S.RECEIPT_RECORDED}, {S.COMMITTED, S.HUMAN_REVIEW}, "anyone",
              "the receipt meets its provider contract (committed) or not (a person decides)"),
        _move("suspend", {S.STARTED}, {S.PLANNED}, "agent",
              "nothing external happened in this attempt (an inner effect paused it, or the"
              " handler never started): the next identical call runs it"),
        _move("late_result", {S.UNKNOWN}, {S.COMMITTED, S.FAILED, S.RECEIPT_RECORDED}, "agent",
              "an attempt outlived its lease and nobody decided since: its outcome stands"),
        # -- OpenOnce's own bookkeeping --------------------------------------------------------
        _move("expire", {S.STARTED}, {S.UNKNOWN}, "openonce",
              "the lease ran out or its owner process is gone: the call may have happened"),
        _move("reconsider", {S.PLANNED, S.APPROVED}, {S.REQUIRES_APPROVAL}, "openonce",
              "the approval expired before the call ran: ask again (fail closed)"),
        _move("contradict", _CAN_BE_CONTRADICTED, {S.HUMAN_REVIEW}, "openonce",
              "later evidence (a late result, a probe that lost a race) contradicts the"
              " recorded state: a person must look, a double execution is never clean"),
        # -- the reconciler ----------------------------------------------------------------------
        _move("probe_happened", {S.UNKNOWN}, {S.RECEIPT_RECORDED}, "reconciler",
              "a probe found the effect at the provider, with a receipt bound to it"),
        _move("probe_not_happened", {S.UNKNOWN}, {S.PLANNED}, "reconciler",
              "a probe found no trace past the grace window where a miss is evidence"),
        _move("escalate", {S.UNKNOWN}, {S.HUMAN_REVIEW}, "reconciler",
              "probes cannot decide (inconclusive, contradictory, no prober): a person decides"),
        _move("reprobe", {S.UNKNOWN}, {S.UNKNOWN}, "reconciler",
              "the prober could not ask the provider; it asks again later"),
        # -- people (the console's decisions) --------------------------------------------------
        _move("approve", {S.REQUIRES_APPROVAL}, {S.REQUIRES_APPROVAL, S.APPROVED}, "operator",
              "one more distinct approver; approved once enough approved", decision=True),
        _move("deny", {S.REQUIRES_APPROVAL, S.APPROVED}, {S.DENIED}, "operator",
              "the call never runs (an approval can be withdrawn until it runs)",
              decision=True),
        _move("cancel", NOT_STARTED, {S.CANCELLED}, "operator",
              "give up an effect that has not started; its calls raise EffectCancelled",
              decision=True),
        _move("release", NOT_STARTED, {S.RELEASED}, "operator",
              "drop a claim that never ran (attempt 0) so its key can be used anew",
              decision=True),
        _move("resolve_happened", UNRESOLVED, {S.RECEIPT_RECORDED}, "operator",
              "a person found it happened: the receipt is committed and replayed",
              decision=True),
        _move("resolve_not_happened", UNRESOLVED, {S.PLANNED}, "operator",
              "a person found it did not happen: the next identical call runs",
              decision=True),
        # -- anyone ------------------------------------------------------------------------------
        _move("note", _EVERY_STATE, _EVERY_STATE, "anyone",
              "an observation that changes no state (kept as evidence)"),
    )
}  # fmt: skip

# The console's decisions, in the order it offers them.
DECISIONS: tuple[str, ...] = tuple(m.action for m in MOVES.values() if m.decision)

# Which states may follow which, whatever the action (for readers; writers use check_move).
LEGAL: dict[EffectState, frozenset[EffectState]] = {
    src: frozenset(
        dst
        for m in MOVES.values()
        if src in m.sources
        for dst in m.targets
        if m.action != "note" or dst == src
    )
    for src in S
}


def move_for(action: str) -> Move:
    move = MOVES.get(action)
    if move is None:
        raise ValueError(f"{action!r} is not a move of the state table")
    return move


def check_move(action: str, src: EffectState, dst: EffectState) -> bool:
    """Whether ``action`` may take an effect from ``src`` to ``dst``."""
    move = MOVES.get(action)
    if move is None or not move.allows(src, dst):
        return False
    return action != "note" or src == dst


def is_legal(src: EffectState, dst: EffectState) -> bool:
    return dst in LEGAL.get(src, frozenset())


def decisions_allowed(state: EffectState | str) -> tuple[str, ...]:
    """The decisions a person may make on an effect in ``state``, in the console's order."""
    current = EffectState(state)
    return tuple(a for a in DECISIONS if current in MOVES[a].sources)
