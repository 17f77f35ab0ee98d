"""Decisions made on what a person saw: stale pages are refused, overrides are journaled."""

from __future__ import annotations

import pytest

from openonce_core import (
    EffectChangedError,
    EffectState,
    OpenOnce,
    OutcomeUnknownError,
    ProviderContractError,
    require_approval_for,
)


def test_a_decision_on_a_stale_version_is_refused_and_changes_nothing(store):
    oo = OpenOnce(store, policy=require_approval_for(["stripe.*"], approvers=2))

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: charge)
    def refund(charge: str) -> dict:
        return {"refund": "re_1"}

    with pytest.raises(Exception) as pending:
        refund("ch_1")
    effect_id = pending.value.effect_id
    seen = oo.get(effect_id).fence
    oo.approve(effect_id, by="ann", reason="first look", expected_fence=seen)
    # Bob's page was loaded before Ann approved: his deny is refused, not applied.
    with pytest.raises(EffectChangedError, match="changed since you looked"):
        oo.deny(effect_id, by="bob", reason="too much", expected_fence=seen)
    effect = oo.get(effect_id)
    assert effect.state == EffectState.REQUIRES_APPROVAL
    assert [a.by for a in oo.approvals(effect_id)] == ["ann"]
    oo.deny(effect_id, by="bob", reason="too much", expected_fence=effect.fence)
    assert oo.get(effect_id).state == EffectState.DENIED


def test_override_of_the_auto_rearm_rule_is_journaled(store):
    oo = OpenOnce(store, retry_delay=0)

    @oo.effect(tool="email.send", idempotency_key=lambda to: to)
    def send(to: str) -> dict:
        raise TimeoutError("SMTP reply lost")

    with pytest.raises(OutcomeUnknownError) as unknown:
        send("a@b.c")
    effect_id = unknown.value.effect_id
    with pytest.raises(ProviderContractError, match="not safe to re-arm"):
        oo.resolve_not_happened(effect_id, by="eve", reason="not in outbox",
                                require_auto_rearm=True)  # fmt: skip
    assert oo.get(effect_id).state == EffectState.UNKNOWN
    oo.resolve_not_happened(
        effect_id, by="eve", reason="checked the SMTP relay log: never accepted",
        require_auto_rearm=True, override_auto_rearm=True,
    )  # fmt: skip
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state, last.actor) == ("unknown", "planned", "operator:eve")
    assert "re-armed although a miss is not evidence" in last.evidence["override"]
    assert last.reason == "checked the SMTP relay log: never accepted"
