"""The only writer of ledger state.

Everything that changes an effect — the agent's call path, a person's decision, the
reconciler, lease expiry — asks :class:`Ledger` to make a *move* of the state table
(``openonce_core._states.MOVES``). The Ledger checks the move, builds the journal line(s),
and hands the store one conditional write: it applies only if the effect is still in the
state, and under the fence, the caller read (invariants 1, 2 and 4 of ARCHITECTURE.md).
Whoever loses a race gets ``False``, re-reads and decides again; nobody overwrites a newer
decision. An illegal move raises :class:`IllegalTransitionError` before anything is
written.

Two writes are not moves, because no state changes: a lease renewal (the heartbeat of a
running handler) and a probe claim (a reconciler marking an UNKNOWN effect as being
asked about). Both are fenced like moves, and neither writes a journal line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._clock import Clock
from ._records import Approval, Effect, JournalEntry
from ._states import EffectState, check_move, move_for
from .errors import IllegalTransitionError
from .stores.base import Store
from .stores.sql import ReplayRow

S = EffectState


@dataclass(frozen=True, slots=True)
class Then:
    """A second move in the same commit (a receipt's check after the receipt)."""

    action: str
    to: EffectState
    reason: str = ""
    evidence: dict[str, Any] | None = None


class Ledger:
    """Checks every write against the state table, then makes it one conditional commit."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock

    # -- moves ----------------------------------------------------------------------------

    def create(
        self,
        effect: Effect,
        action: str,
        *,
        actor: str,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
        find: bool = False,
    ) -> tuple[bool, ReplayRow | None]:
        """Write a new effect (its first line reads ``planned -> <its state>``). Returns
        ``(True, None)`` if it was written, else ``(False, what holds its key)`` — the
        holder is read in the same round trip when ``find`` is true and the store can."""
        self._check(effect.id, action, S.PLANNED, effect.state, creating=True)
        entry = JournalEntry(
            effect.id, S.PLANNED, effect.state, actor, reason, evidence, effect.created_at,
            action=action,
        )  # fmt: skip
        if find:
            return self.store.insert_or_find(effect, (entry,))
        return self.store.insert(effect, (entry,)), None

    def move(
        self,
        effect: Effect,
        action: str,
        to: EffectState,
        *,
        actor: str,
        reason: str = "",
        evidence: dict[str, Any] | None = None,
        changes: dict[str, Any] | None = None,
        approval: Approval | None = None,
        then: Then | None = None,
        at: float | None = None,
    ) -> bool:
        """Move ``effect`` (as the caller read it) to ``to`` — and on to ``then.to`` in the
        same commit. False if someone moved it first. Every move ends any lease or probe
        claim on the effect, and forgets when to probe it next (``next_probe_at``), unless
        ``changes`` sets a new one."""
        self._check(effect.id, action, effect.state, to)
        final = to
        if then is not None:
            self._check(effect.id, then.action, to, then.to)
            final = then.to
        at = self.clock.now() if at is None else at
        all_changes: dict[str, Any] = {
            "state": final,
            "fence": effect.fence + 1,
            "updated_at": at,
            "lease_owner": None,
            "lease_expires_at": None,
            "next_probe_at": None,
        }
        if changes:
            all_changes.update(changes)
        entries = [
            JournalEntry(effect.id, effect.state, to, actor, reason, evidence, at, action=action)
        ]
        if then is not None:
            entries.append(
                JournalEntry(
                    effect.id,
                    to,
                    then.to,
                    actor,
                    then.reason,
                    then.evidence,
                    at,
                    action=then.action,
                )
            )
        return self.store.update(
            effect.id, (effect.state,), effect.fence, all_changes, entries, approval
        )

    def note(
        self,
        effect_id: str,
        *,
        actor: str,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> EffectState | None:
        """Journal an observation that changes nothing (evidence that lost a race, a late
        result that agrees with what is recorded). Returns the state it was noted in."""
        current = self.store.get(effect_id)
        if current is None:
            return None
        entry = JournalEntry(
            effect_id, current.state, current.state, actor, reason, evidence, self.clock.now(),
            action="note",
        )  # fmt: skip
        self.store.append_journal(entry)
        return current.state

    # -- writes that are not moves ---------------------------------------------------------

    def renew_lease(self, effect_id: str, fence: int, owner: str, until: float) -> bool:
        """Push out the lease of a running attempt; False if the claim is no longer ours."""
        return self.store.renew(effect_id, fence, owner, until)

    def claim_for_probe(
        self,
        effect_ids: Sequence[str],
        owner: str,
        until: float,
        *,
        steal_from: Sequence[str] = (),
        expect_fence: int | None = None,
    ) -> list[str]:
        """Mark UNKNOWN effects as being probed by ``owner`` until ``until``."""
        return self.store.claim(
            effect_ids,
            owner,
            until,
            self.clock.now(),
            steal_from=steal_from,
            expect_fence=expect_fence,
        )

    # -- the rule ---------------------------------------------------------------------------

    @staticmethod
    def _check(
        effect_id: str,
        action: str,
        src: EffectState,
        dst: EffectState,
        *,
        creating: bool = False,
    ) -> None:
        move = move_for(action)
        if move.creates != creating or not check_move(action, src, dst):
            raise IllegalTransitionError(
                effect_id, src, action, f"the state table has no {action}: {src} -> {dst}"
            )
