"""Holes an invariant review found, each closed and kept closed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from openonce_core import (
    ApprovalExpired,
    ApprovalPending,
    EffectState,
    IllegalTransitionError,
    InvalidArgumentsError,
    LeaseLostError,
    OpenOnce,
    OutcomeUnknownError,
    RetryableEffectError,
    require_approval_for,
)
from openonce_core.testing import FakeClock

S = EffectState


class GatedClock(FakeClock):
    """A FakeClock whose sleep() holds the sleeper until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeping = threading.Event()
        self.wake = threading.Event()

    def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        assert self.wake.wait(10), "the test never woke the sleeper"
        super().sleep(seconds)


def test_a_claim_lost_while_waiting_to_retry_is_never_called_again(store):
    """Claim before call holds for retries too: the wait comes before the renewed claim."""
    clock = GatedClock()
    oo = OpenOnce(store, retry_delay=1.0, lease_seconds=60, owner="A", clock=clock)
    oo.keeper.close()  # A is stopped while it waits: nothing renews its lease
    calls: list[int] = []

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order: order, max_attempts=3)
    def charge(order: str) -> dict:
        calls.append(len(calls))
        raise RetryableEffectError("connect refused")

    outcome: dict[str, BaseException] = {}

    def run() -> None:
        try:
            charge("o-1")
        except BaseException as exc:
            outcome["A"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert clock.sleeping.wait(10)
    # While A waits to retry, its lease lapses and a person re-arms the effect.
    clock.advance(61)
    effect_id = store.list_effects()[0].id
    oo.expire_leases()
    assert oo.get(effect_id).state == S.UNKNOWN
    oo.resolve_not_happened(effect_id, by="eve", reason="connect refused: nothing was sent")
    clock.wake.set()
    worker.join(5)
    assert isinstance(outcome["A"], LeaseLostError)
    assert calls == [0]  # A never called again after losing its claim
    # Nothing was sent by A's attempt, so the re-arm stands; the late line is evidence.
    assert oo.get(effect_id).state == S.PLANNED
    assert oo.journal(effect_id)[-1].evidence["observed"] == "retryable"


def test_a_re_armed_effect_needs_its_approval_to_still_hold(store):
    clock = FakeClock()
    oo = OpenOnce(store, policy=require_approval_for(["stripe.*"], approval_ttl=300), clock=clock)
    calls: list[str] = []

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: charge)
    def refund(charge: str) -> dict:
        calls.append(charge)
        raise TimeoutError("reply lost")

    with pytest.raises(ApprovalPending) as pending:
        refund("ch_1")
    effect_id = pending.value.effect_id
    oo.approve(effect_id, by="ann", reason="ok")
    with pytest.raises(OutcomeUnknownError):
        refund("ch_1")
    clock.advance(301)  # the approval lapses
    oo.resolve_not_happened(effect_id, by="eve", reason="not in the dashboard")
    with pytest.raises(ApprovalExpired):
        refund("ch_1")
    assert calls == ["ch_1"]
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL
    assert oo.journal(effect_id)[-1].reason == "approval expired before the call ran"


def test_a_refused_decision_changes_nothing_even_on_a_lapsed_lease(store):
    clock = FakeClock()
    oo = OpenOnce(store, lease_seconds=60, clock=clock)
    oo.keeper.close()  # a stopped process: its lease lapses
    started = threading.Event()
    release = threading.Event()

    @oo.effect(tool="t.slow", idempotency_key=lambda n: f"k{n}")
    def slow(n: int) -> int:
        started.set()
        release.wait(5)
        return n

    worker = threading.Thread(target=slow, args=(1,))
    worker.start()
    started.wait(5)
    clock.advance(61)
    effect_id = store.list_effects()[0].id
    before = oo.journal(effect_id)
    with pytest.raises(IllegalTransitionError):
        oo.cancel(effect_id, by="eve", reason="stop it")
    assert oo.get(effect_id).state == S.STARTED
    assert oo.journal(effect_id) == before
    release.set()
    worker.join(5)


def test_names_and_reasons_are_checked_before_anything_is_written(store):
    oo = OpenOnce(store, policy=require_approval_for(["pay"], approvers=2))

    @oo.effect(tool="pay", idempotency_key=lambda n: f"p{n}")
    def pay(n: int) -> dict:
        return {"paid": n}

    with pytest.raises(ApprovalPending) as pending:
        pay(1)
    effect_id = pending.value.effect_id
    oo.approve(effect_id, by="alice")
    with pytest.raises(ValueError, match="spaces"):
        oo.approve(effect_id, by="alice ")
    with pytest.raises(ValueError, match="reason must be text"):
        oo.approve(effect_id, by="bob", reason=None)  # type: ignore[arg-type]
    assert [a.by for a in oo.approvals(effect_id)] == ["alice"]
    assert oo.get(effect_id).state == S.REQUIRES_APPROVAL


def test_deeply_nested_arguments_get_a_clear_error(store):
    oo = OpenOnce(store)

    @oo.effect(tool="t.deep", idempotency_key=lambda doc: "d")
    def deep(doc: list) -> None:
        return None

    doc: list = []
    for _ in range(5000):
        doc = [doc]
    with pytest.raises(InvalidArgumentsError, match="nested deeper than"):
        deep(doc)
    assert store.list_effects() == []


def test_a_sync_wrapper_returning_a_coroutine_is_refused_not_committed(store):
    oo = OpenOnce(store)
    sent: list[str] = []

    async def send(to: str) -> dict:
        sent.append(to)
        return {"id": "m1"}

    wrapped = oo.effect(lambda to: send(to), tool="email.send", idempotency_key=lambda to: to)
    with pytest.raises(TypeError, match="declare the handler"):
        wrapped("a@b.c")
    effect = store.list_effects()[0]
    assert effect.state == S.FAILED
    assert sent == []  # the coroutine was closed, never run outside the ledger
    asyncio.run(asyncio.sleep(0))
