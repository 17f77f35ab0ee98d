"""Approvals.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import pytest

from openonce_core import (
    ApprovalDenied,
    ApprovalExpired,
    ApprovalPending,
    ApproverAlreadyCounted,
    IdempotencyMismatchError,
    IllegalTransitionError,
    OpenOnce,
    OpenOnceError,
    require_approval_for,
)
from openonce_core.testing import FakeClock

from .helpers import (
    AGENT,
    OWNER,
    S,
    moves,
    refund_tool,
)


def test_approval_pending_then_the_same_call_executes_once(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    calls_email: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls_email.append(to)
        return "sent"

    assert send("a@b.c") == "sent"  # not matched by the policy
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    assert info.value.tool == "stripe.refund"
    assert (info.value.approvals, info.value.required) == (0, 1)
    with pytest.raises(ApprovalPending) as again:
        refund("ch_1", 500)  # the agent retries before anyone approved
    assert again.value.effect_id == effect_id
    assert calls == []
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert oo.get(effect_id).attempt == 0
    assert [e.id for e in oo.review()] == [effect_id]

    approved = oo.approve(effect_id, by="eric", reason="customer called")
    assert approved.state == S.APPROVED
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert calls == [("ch_1", 500)]
    assert calls_email == ["a@b.c"]
    assert moves(oo, effect_id) == [
        (S.PLANNED, S.REQUIRES_APPROVAL),
        (S.REQUIRES_APPROVAL, S.APPROVED),
        (S.APPROVED, S.STARTED),
        (S.STARTED, S.COMMITTED),
    ]
    journal = oo.journal(effect_id)
    assert journal[0].actor == AGENT
    assert "stripe.*" in journal[0].reason
    assert journal[1].actor == "operator:eric"
    assert journal[1].reason == "customer called"
    assert journal[1].evidence == {"approvals": 1, "required": 1}
    [approval] = oo.approvals(effect_id)
    assert (approval.decision, approval.by, approval.reason) == (
        "approve",
        "eric",
        "customer called",
    )


def test_denied_effect_raises_approval_denied_on_every_call(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    with pytest.raises(ValueError, match="reason"):
        oo.deny(effect_id, by="maria", reason="")
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    oo.deny(effect_id, by="maria", reason="looks like fraud")
    for _ in range(2):
        with pytest.raises(ApprovalDenied) as denied:
            refund("ch_1", 500)
        assert denied.value.effect_id == effect_id
        assert denied.value.by == "maria"
        assert denied.value.reason == "looks like fraud"
    assert calls == []
    assert oo.get(effect_id).state == S.DENIED
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.DENIED)
    assert (last.actor, last.reason) == ("operator:maria", "looks like fraud")
    with pytest.raises(IllegalTransitionError):
        oo.approve(effect_id, by="eric", reason="changed my mind")
    assert oo.get(effect_id).state == S.DENIED


def test_approval_does_not_carry_over_to_different_arguments_under_an_explicit_key(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    oo.approve(info.value.effect_id, by="eric", reason="500 is right")
    with pytest.raises(IdempotencyMismatchError):
        refund("ch_1", 50_000)
    assert calls == []
    assert refund("ch_1", 500)["amount_cents"] == 500
    assert calls == [("ch_1", 500)]


def test_approval_is_void_for_arguments_the_approver_did_not_see(store):
    """An approval is bound to the arguments it was given for (ASVS: an approval is void if
    the arguments change). With ``idempotency_fields=["charge"]`` the amount is not key
    material, so a later call with a larger amount maps to the same approved effect."""
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo, idempotency_key=None, idempotency_fields=["charge"])
    with oo.scope("run-1"):
        with pytest.raises(ApprovalPending) as info:
            refund("ch_1", 500)
        effect_id = info.value.effect_id
        assert oo.get(effect_id).args == {"charge": "ch_1", "amount_cents": 500}
        oo.approve(effect_id, by="eric", reason="refund of 500 cents is right")
        with pytest.raises(OpenOnceError):
            refund("ch_1", 50_000)
    assert ("ch_1", 50_000) not in calls


def test_approval_ttl_expiry_fails_closed(store):
    # A FakeClock sets when the approval runs out: a fresh approval stays valid however
    # slowly the machine reaches the call that uses it (a 0.3 s TTL in real time did not).
    clock = FakeClock()
    policy = require_approval_for(["stripe.*"], approval_ttl=300)
    oo = OpenOnce(store, retry_delay=0, policy=policy, clock=clock)
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    oo.approve(effect_id, by="eric", reason="ok")
    assert oo.get(effect_id).state == S.APPROVED
    clock.advance(301)
    with pytest.raises(ApprovalExpired) as expired:
        refund("ch_1", 500)
    assert isinstance(expired.value, ApprovalPending)
    assert expired.value.effect_id == effect_id
    assert calls == []
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.APPROVED, S.REQUIRES_APPROVAL)
    assert last.actor == "openonce"
    assert "expired" in last.reason
    with pytest.raises(ApprovalPending):
        refund("ch_1", 500)  # still closed until someone approves afresh
    # The expired approval no longer counts, so the same person may approve again.
    oo.approve(effect_id, by="eric", reason="still ok")
    assert refund("ch_1", 500) == {"refund": "re_1", "amount_cents": 500}
    assert calls == [("ch_1", 500)]


def test_two_approvers_must_be_two_distinct_people(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"], approvers=2))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500_000)
    effect_id = info.value.effect_id
    assert info.value.required == 2
    after_one = oo.approve(effect_id, by="eric", reason="large but expected")
    assert after_one.state == S.REQUIRES_APPROVAL
    with pytest.raises(ApprovalPending) as pending:
        refund("ch_1", 500_000)
    assert (pending.value.approvals, pending.value.required) == (1, 2)
    with pytest.raises(ApproverAlreadyCounted):
        oo.approve(effect_id, by="eric", reason="approving again")
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert len(oo.approvals(effect_id)) == 1
    assert calls == []
    assert oo.approve(effect_id, by="maria", reason="checked").state == S.APPROVED
    assert refund("ch_1", 500_000)["amount_cents"] == 500_000
    assert refund("ch_1", 500_000)["amount_cents"] == 500_000
    assert calls == [("ch_1", 500_000)]
    approvals = oo.journal(effect_id)[1:3]
    assert [(j.actor, j.evidence) for j in approvals] == [
        ("operator:eric", {"approvals": 1, "required": 2}),
        ("operator:maria", {"approvals": 2, "required": 2}),
    ]
