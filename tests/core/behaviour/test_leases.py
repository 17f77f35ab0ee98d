"""Leases and fencing.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from openonce_core import (
    EffectCancelled,
    EffectInFlightError,
    IllegalTransitionError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnce,
    OutcomeUnknownError,
    current_effect,
)
from openonce_core.testing import FakeClock

from .helpers import (
    OWNER,
    CardDeclined,
    S,
    in_thread,
    moves,
    only_effect,
    wait_until,
)


def _slow_sender(oo: OpenOnce, release: threading.Event, entered: threading.Event):
    calls: list[int] = []
    ids: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, Any]:
        attempt = current_effect().attempt
        calls.append(attempt)
        ids.append(current_effect().effect_id)
        if len(calls) == 1:
            entered.set()
            assert release.wait(10), "test never released the first attempt"
        return {"message_id": f"m-{attempt}"}

    return send, calls, ids


def stalled(oo: OpenOnce) -> OpenOnce:
    """Stop ``oo`` renewing its leases, like a process that was stopped (SIGSTOP) or cut off
    from the ledger while its handler runs: its lease can now run out."""
    oo.keeper.close()
    return oo


def test_a_running_handler_keeps_its_lease(store):
    clock = FakeClock()
    oo = OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock)
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        effect_id = ids[0]
        for _ in range(4):  # four minutes of a 60 s lease: renewed, never expired
            before = oo.get(effect_id).lease_expires_at
            clock.advance(25)
            wait_until(lambda b=before: oo.get(effect_id).lease_expires_at != b, "a renewal")
            assert oo.get(effect_id).lease_expires_at == clock.now() + 60
            assert oo.expire_leases() == []
        effect = oo.get(effect_id)
        assert effect.state == S.STARTED and effect.fence == 1  # renewals keep the fence
        assert moves(oo, effect_id) == [(S.PLANNED, S.STARTED)]  # and write no journal
    finally:
        release.set()
    assert first.result(timeout=10) == {"message_id": "m-1"}
    assert oo.get(ids[0]).state == S.COMMITTED
    assert calls == [1]


def test_a_handler_can_ask_whether_it_still_owns_its_effect(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    other = OpenOnce(store, retry_delay=0, clock=clock)
    seen: list[bool] = []
    go_on = threading.Event()
    entered = threading.Event()

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> str:
        ctx = current_effect()
        seen.append(ctx.owns())
        entered.set()
        assert go_on.wait(10)
        seen.append(ctx.owns())  # about to do the irreversible part: still mine?
        seen.append(ctx.renew())
        return "sent"

    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    assert other.expire_leases() != []  # the lease lapsed: the effect is UNKNOWN now
    go_on.set()
    assert first.result(timeout=10) == "sent"
    assert seen == [True, False, False]
    # Nobody decided meanwhile, so its late receipt stands — but it could have asked first.
    assert only_effect(store).verification_status == "late_receipt"


def test_expired_lease_becomes_unknown_and_is_never_run_again(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")  # a worker that hangs (or died) mid-call
    try:
        assert entered.wait(5)
        effect_id = ids[0]
        clock.advance(59)
        assert oo.expire_leases() == []  # the lease still runs
        assert oo.get(effect_id).state == S.STARTED
        assert oo.review() == []
        clock.advance(2)
        assert oo.expire_leases() == [effect_id]
        effect = oo.get(effect_id)
        assert effect.state == S.UNKNOWN
        assert effect.lease_owner is None
        assert effect.execution_status == "unknown"
        last = oo.journal(effect_id)[-1]
        assert (last.from_state, last.to_state, last.action) == (S.STARTED, S.UNKNOWN, "expire")
        assert last.actor == "openonce"
        assert last.reason == f"lease of attempt 1 held by {OWNER} expired"
        for _ in range(2):
            with pytest.raises(OutcomeUnknownError):
                send("a@b.c")
        assert calls == [1]
        assert oo.expire_leases() == []
    finally:
        release.set()
        first.exception(timeout=10)


def test_duplicate_waiting_on_an_expired_lease_gets_unknown_not_a_rerun(store):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, wait_seconds=300, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        # Arrives while the lease is live: waits for it, then finds it expired.
        duplicate = in_thread(send, "a@b.c")
        wait_until(lambda: store.board.waiting() == [ids[0]], "the duplicate to wait")
        assert not duplicate.done()
        clock.advance(61)
        with pytest.raises(OutcomeUnknownError):
            duplicate.result(timeout=10)
        assert oo.get(ids[0]).state == S.UNKNOWN
        assert calls == [1]
    finally:
        release.set()
        first.exception(timeout=10)


def test_duplicate_gives_up_waiting_on_a_live_lease(store):
    oo = OpenOnce(store, retry_delay=0, lease_seconds=30, wait_seconds=0.1)
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    try:
        assert entered.wait(5)
        with pytest.raises(EffectInFlightError) as info:
            send("a@b.c")
        assert info.value.effect_id == ids[0]
        # A running effect is not a person's to resolve: its lease is live.
        with pytest.raises(IllegalTransitionError):
            oo.resolve_not_happened(ids[0], by="eric", reason="looks stuck")
        with pytest.raises(IllegalTransitionError):
            oo.resolve_happened(ids[0], receipt={"id": "m-1"}, by="eric", reason="seen")
        assert oo.get(ids[0]).state == S.STARTED
        assert calls == [1]
    finally:
        release.set()
    assert first.result(timeout=10) == {"message_id": "m-1"}
    assert send("a@b.c") == {"message_id": "m-1"}
    assert calls == [1]


def _lapsed(store: Any) -> tuple[OpenOnce, FakeClock, Any, list[int], list[str], Any, Any]:
    """An attempt that is still running after its lease lapsed: its effect is UNKNOWN."""
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()
    send, calls, ids = _slow_sender(oo, release, entered)
    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    assert oo.expire_leases() == [ids[0]]
    return oo, clock, send, calls, ids, first, release


def test_late_result_commits_when_nobody_decided(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        with pytest.raises(OutcomeUnknownError):
            send("a@b.c")
    finally:
        release.set()
    # The slow attempt returns after all: its receipt resolves the uncertainty.
    assert first.result(timeout=10) == {"message_id": "m-1"}
    effect = oo.get(ids[0])
    assert effect.state == S.COMMITTED
    assert effect.result == {"message_id": "m-1"}
    assert effect.verification_status == "late_receipt"
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state, last.action) == (S.UNKNOWN, S.COMMITTED, "late_result")
    assert last.reason == "late result of attempt 1 after its lease expired"
    assert send("a@b.c") == {"message_id": "m-1"}
    assert calls == [1]


def test_late_result_after_a_committed_retry_is_a_double_execution_for_a_person(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        # The re-armed effect runs again as attempt 2 and commits.
        assert send("a@b.c") == {"message_id": "m-2"}
        assert oo.get(ids[0]).state == S.COMMITTED
    finally:
        release.set()
    error = first.exception(timeout=10)
    assert isinstance(error, LeaseLostError)
    assert isinstance(error, LedgerWriteError)
    assert error.effect_id == ids[0]
    assert error.observed_outcome == "returned"
    assert error.observed_value == {"message_id": "m-1"}
    # Both attempts sent the mail: never a clean COMMITTED, a person must look.
    effect = oo.get(ids[0])
    assert effect.state == S.HUMAN_REVIEW
    assert effect.attempt == 2
    assert effect.result == {"message_id": "m-2"}  # the fenced-off result did not overwrite
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state, last.action) == (
        S.COMMITTED, S.HUMAN_REVIEW, "contradict",
    )  # fmt: skip
    assert last.reason.startswith("attempt 1 finished (returned) after losing its lease")
    assert "committed (attempt 2)" in last.reason
    assert last.evidence["observed"] == "returned"
    assert last.evidence["attempt"] == 1
    assert last.evidence["result"] == {"message_id": "m-1"}
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")
    assert calls == [1, 2]


def test_late_result_contradicting_a_not_happened_decision_goes_to_human_review(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        assert oo.get(ids[0]).state == S.PLANNED
    finally:
        release.set()
    error = first.exception(timeout=10)
    assert isinstance(error, LeaseLostError)
    assert error.observed_value == {"message_id": "m-1"}
    assert oo.get(ids[0]).state == S.HUMAN_REVIEW
    last = oo.journal(ids[0])[-1]
    assert (last.from_state, last.to_state) == (S.PLANNED, S.HUMAN_REVIEW)
    assert last.actor == "openonce"
    assert "contradicts the recorded planned" in last.reason
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")
    assert calls == [1]


@pytest.mark.parametrize("outcome", ["failed", "unknown"])
def test_a_late_failure_after_a_re_arm_is_journaled_and_escalated(store, outcome):
    clock = FakeClock()
    oo = stalled(OpenOnce(store, retry_delay=0, lease_seconds=60, owner=OWNER, clock=clock))
    release, entered = threading.Event(), threading.Event()

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> None:
        entered.set()
        assert release.wait(10)
        raise CardDeclined("no") if outcome == "failed" else TimeoutError("read timed out")

    oo_business = OpenOnce(store, retry_delay=0, clock=clock)
    first = in_thread(send, "a@b.c")
    assert entered.wait(5)
    clock.advance(61)
    (effect_id,) = oo_business.expire_leases()
    oo.resolve_not_happened(effect_id, by="eric", reason="not sent")
    release.set()
    assert isinstance(first.exception(timeout=10), LeaseLostError)
    # Not "only journaled": whatever the first attempt did, a person decides the re-run.
    assert oo.get(effect_id).state == S.HUMAN_REVIEW
    last = oo.journal(effect_id)[-1]
    assert (last.from_state, last.to_state) == (S.PLANNED, S.HUMAN_REVIEW)
    assert last.evidence["observed"] == outcome


def test_a_cancel_names_who_cancelled_and_a_late_result_after_it_escalates(store):
    oo, _, send, calls, ids, first, release = _lapsed(store)
    try:
        oo.resolve_not_happened(ids[0], by="eric", reason="not in the sent folder")
        oo.cancel(ids[0], by="eric", reason="customer withdrew")
        with pytest.raises(EffectCancelled) as cancelled:
            send("a@b.c")
        assert "eric" in str(cancelled.value)
        assert "customer withdrew" in str(cancelled.value)
    finally:
        release.set()
    assert isinstance(first.exception(timeout=10), LeaseLostError)
    # The cancelled effect had happened after all: a person must know.
    assert oo.get(ids[0]).state == S.HUMAN_REVIEW
    assert [line.action for line in oo.journal(ids[0])][-2:] == ["cancel", "contradict"]
    assert calls == [1]
