"""Decisions by people.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from datetime import date

import pytest

from openonce_core import (
    ApprovalPending,
    EffectCancelled,
    EffectNotFoundError,
    IdempotencyMismatchError,
    IllegalTransitionError,
    InvalidReceiptError,
    OpenOnce,
    OutcomeUnknownError,
    require_approval_for,
)

from .helpers import (
    OWNER,
    S,
    ambiguous_charge,
    moves,
    only_effect,
    park_unknown,
    refund_tool,
)


def test_resolve_happened_commits_the_receipt_and_duplicates_replay_it(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    committed = oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_1"}, by="eric", reason="matched in dashboard"
    )
    assert committed.state == S.COMMITTED
    assert charge(500) == {"stripe_id": "pi_1"}
    assert charge(500) == {"stripe_id": "pi_1"}
    assert calls == [1]
    # As the spec's journal shows it: the receipt, then its check, in the same commit.
    receipt_line, verdict = oo.journal(effect_id)[-2:]
    assert (receipt_line.from_state, receipt_line.to_state, receipt_line.action) == (
        S.UNKNOWN, S.RECEIPT_RECORDED, "resolve_happened",
    )  # fmt: skip
    assert (receipt_line.actor, receipt_line.reason) == ("operator:eric", "matched in dashboard")
    assert receipt_line.evidence["receipt"] == {"stripe_id": "pi_1"}
    assert receipt_line.evidence["resolution"] == "happened"
    assert (verdict.from_state, verdict.to_state, verdict.action) == (
        S.RECEIPT_RECORDED, S.COMMITTED, "check_receipt",
    )  # fmt: skip
    assert verdict.at == receipt_line.at and verdict.seq == receipt_line.seq + 1


@pytest.mark.parametrize(
    "receipt",
    [
        pytest.param({}, id="empty"),
        pytest.param([{"stripe_id": "pi_1"}], id="list"),
        pytest.param("pi_1", id="string"),
        pytest.param(None, id="none"),
        pytest.param({"stripe_id": b"pi_1"}, id="bytes-value"),
        pytest.param({"at": date(2026, 7, 2)}, id="date-value"),
        pytest.param({"ids": ("pi_1",)}, id="tuple-value"),
        pytest.param({"amount": float("nan")}, id="nan"),
        pytest.param({1: "pi_1"}, id="int-key"),
    ],
)
def test_malformed_receipts_are_refused_and_change_nothing(store, receipt):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    journal_before = oo.journal(effect_id)
    with pytest.raises(InvalidReceiptError):
        oo.resolve_happened(effect_id, receipt=receipt, by="eric", reason="found it")
    effect = oo.get(effect_id)
    assert effect.state == S.UNKNOWN
    assert effect.result is None
    assert effect.verification_status is None
    assert oo.journal(effect_id) == journal_before
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [1]


def test_resolve_not_happened_needs_a_reason_and_re_arms(store):
    oo = OpenOnce(store, retry_delay=0, owner=OWNER)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    for reason in ("", "   "):
        with pytest.raises(ValueError, match="reason"):
            oo.resolve_not_happened(effect_id, by="eric", reason=reason)
    with pytest.raises(ValueError, match="by"):
        oo.resolve_not_happened(effect_id, by="", reason="not in dashboard")
    assert oo.get(effect_id).state == S.UNKNOWN
    rearmed = oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    assert rearmed.state == S.PLANNED
    assert charge(500) == {"id": "pi_2"}
    assert charge(500) == {"id": "pi_2"}
    assert calls == [1, 2]
    effect = oo.get(effect_id)
    assert effect.state == S.COMMITTED
    assert effect.attempt == 2
    assert moves(oo, effect_id) == [
        (S.PLANNED, S.STARTED),
        (S.STARTED, S.UNKNOWN),
        (S.UNKNOWN, S.PLANNED),
        (S.PLANNED, S.STARTED),
        (S.STARTED, S.COMMITTED),
    ]
    journal = oo.journal(effect_id)
    assert (journal[2].actor, journal[2].reason) == ("operator:eric", "not in dashboard")
    assert journal[3].evidence == {"attempt": 2}


def test_cancel_stops_an_unstarted_effect_for_good(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    with pytest.raises(ValueError, match="reason"):
        oo.cancel(effect_id, by="eric", reason=" ")
    assert oo.cancel(effect_id, by="eric", reason="customer withdrew").state == S.CANCELLED
    for _ in range(2):
        with pytest.raises(EffectCancelled) as cancelled:
            refund("ch_1", 500)
        assert cancelled.value.effect_id == effect_id
        assert "customer withdrew" in str(cancelled.value)
        assert "eric" in str(cancelled.value)
    assert calls == []
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.CANCELLED)
    assert (last.actor, last.reason) == ("operator:eric", "customer withdrew")


def test_cancel_a_re_armed_effect(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    oo.cancel(effect_id, by="eric", reason="customer paid by bank transfer")
    with pytest.raises(EffectCancelled):
        charge(500)
    assert calls == [1]


def test_release_unstarted_lets_the_key_be_claimed_with_other_arguments(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    old_id = info.value.effect_id
    released = oo.release_unstarted(old_id, by="eric", reason="wrong amount requested")
    assert released.state == S.RELEASED
    last = oo.journal(old_id)[-1]
    assert (last.from_state, last.to_state) == (S.REQUIRES_APPROVAL, S.RELEASED)
    assert (last.actor, last.reason) == ("operator:eric", "wrong amount requested")
    with pytest.raises(ApprovalPending) as fresh:
        refund("ch_1", 700)  # same key, new arguments: a new claim, not a mismatch
    new_id = fresh.value.effect_id
    assert new_id != old_id
    oo.approve(new_id, by="eric", reason="700 is right")
    assert refund("ch_1", 700)["amount_cents"] == 700
    assert calls == [("ch_1", 700)]
    with pytest.raises(IdempotencyMismatchError):
        refund("ch_1", 500)
    assert oo.get(old_id).state == S.RELEASED
    assert oo.get(new_id).state == S.COMMITTED


def test_release_refuses_an_effect_that_already_ran(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    oo.resolve_not_happened(effect_id, by="eric", reason="not in dashboard")
    assert oo.get(effect_id).attempt == 1
    with pytest.raises(IllegalTransitionError, match="attempt 1"):
        oo.release_unstarted(effect_id, by="eric", reason="start over")
    assert oo.get(effect_id).state == S.PLANNED
    assert calls == [1]


def test_illegal_transitions_are_refused_and_change_nothing(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        calls.append(to)
        return "sent"

    send("a@b.c")
    effect_id = only_effect(store).id
    journal_before = oo.journal(effect_id)
    decisions = [
        lambda: oo.approve(effect_id, by="eric", reason="ok"),
        lambda: oo.deny(effect_id, by="eric", reason="no"),
        lambda: oo.cancel(effect_id, by="eric", reason="stop"),
        lambda: oo.release_unstarted(effect_id, by="eric", reason="drop"),
        lambda: oo.resolve_happened(effect_id, receipt={"id": "x"}, by="eric", reason="seen"),
        lambda: oo.resolve_not_happened(effect_id, by="eric", reason="not seen"),
    ]
    for decide in decisions:
        with pytest.raises(IllegalTransitionError) as info:
            decide()
        assert info.value.effect_id == effect_id
        assert info.value.state == S.COMMITTED
        assert "committed" in str(info.value)
    assert oo.get(effect_id).state == S.COMMITTED
    assert oo.journal(effect_id) == journal_before
    assert send("a@b.c") == "sent"
    assert calls == ["a@b.c"]


def test_approving_an_unknown_outcome_is_illegal(store):
    oo = OpenOnce(store, retry_delay=0)
    charge, calls = ambiguous_charge(oo)
    effect_id = park_unknown(oo, charge)
    with pytest.raises(IllegalTransitionError):
        oo.approve(effect_id, by="eric", reason="just run it")
    with pytest.raises(IllegalTransitionError):
        oo.cancel(effect_id, by="eric", reason="forget it")
    assert oo.get(effect_id).state == S.UNKNOWN
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [1]


def test_unknown_effect_ids_raise_effect_not_found(store):
    oo = OpenOnce(store, retry_delay=0)
    missing = "eff_does_not_exist"
    calls = [
        lambda: oo.get(missing),
        lambda: oo.journal(missing),
        lambda: oo.approvals(missing),
        lambda: oo.approve(missing, by="eric", reason="ok"),
        lambda: oo.deny(missing, by="eric", reason="no"),
        lambda: oo.cancel(missing, by="eric", reason="stop"),
        lambda: oo.release_unstarted(missing, by="eric", reason="drop"),
        lambda: oo.resolve_happened(missing, receipt={"id": "x"}, by="eric", reason="seen"),
        lambda: oo.resolve_not_happened(missing, by="eric", reason="not seen"),
    ]
    for call in calls:
        with pytest.raises(EffectNotFoundError) as info:
            call()
        assert info.value.effect_id == missing
    assert store.list_effects() == []


def test_every_decision_needs_a_named_person(store):
    oo = OpenOnce(store, retry_delay=0, policy=require_approval_for(["stripe.*"]))
    refund, calls = refund_tool(oo)
    with pytest.raises(ApprovalPending) as info:
        refund("ch_1", 500)
    effect_id = info.value.effect_id
    for by in ("", "  ", None):
        with pytest.raises(ValueError, match="by"):
            oo.approve(effect_id, by=by, reason="ok")  # type: ignore[arg-type]
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert oo.approvals(effect_id) == []
    with pytest.raises(ApprovalPending):
        refund("ch_1", 500)
    assert calls == []
