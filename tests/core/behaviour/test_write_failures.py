"""A ledger write that fails after the call.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import pytest

from openonce_core import (
    EffectInFlightError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnce,
    OutcomeUnknownError,
)
from openonce_core.testing import FakeClock

from .helpers import (
    CardDeclined,
    CommitFailsStore,
    S,
    in_thread,
    only_effect,
    wait_until,
)


def test_failed_finishing_write_raises_ledger_write_error_and_never_reruns(store):
    # The ledger's time is a FakeClock: "the lease is still live" and "it ran out" are
    # moments the test sets, not a 0.3 s window a stall (GC, fsync, a busy CI) can miss.
    clock = FakeClock()
    oo = OpenOnce(
        CommitFailsStore(store), retry_delay=0, lease_seconds=60, wait_seconds=5, clock=clock
    )
    calls: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> dict[str, str]:
        calls.append(to)
        return {"message_id": "m-1"}

    with pytest.raises(LedgerWriteError) as info:
        send("a@b.c")
    error = info.value
    assert not isinstance(error, LeaseLostError)
    assert error.observed_outcome == "returned"
    assert error.observed_value == {"message_id": "m-1"}
    assert "disk full" in str(error)
    assert "Do not repeat the call" in str(error)
    effect = only_effect(store)
    assert error.effect_id == effect.id
    assert effect.state == S.STARTED  # the claim stands; the outcome was not recorded
    try:
        # The lease is still live: a duplicate waits, then gives up.
        duplicate = in_thread(send, "a@b.c")
        wait_until(lambda: store.board.waiting() == [effect.id], "the duplicate to wait")
        assert not duplicate.done()
        clock.advance(5)  # its wait_seconds pass; 55 s of the lease are left
        with pytest.raises(EffectInFlightError):
            duplicate.result(timeout=30)
        lease_end = oo.get(effect.id).lease_expires_at
        assert lease_end is not None and lease_end > clock.now()  # it gave up on a live lease
        clock.advance(56)  # the lease ran out: UNKNOWN, not a second send
        late = in_thread(send, "a@b.c")  # a thread: were the lease live, it would wait
        with pytest.raises(OutcomeUnknownError):
            late.result(timeout=30)
    finally:
        clock.advance(600)  # a call still waiting (the test failed) ends its wait
    assert oo.get(effect.id).state == S.UNKNOWN
    assert calls == ["a@b.c"]


def test_failed_finishing_write_after_a_business_error_carries_the_exception(store):
    failing = CommitFailsStore(store, failing_states=(S.FAILED,))
    oo = OpenOnce(failing, retry_delay=0)
    calls: list[int] = []
    declined = CardDeclined("card declined")

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise declined

    with pytest.raises(LedgerWriteError) as info:
        charge(500)
    assert info.value.observed_outcome == "failed"
    assert info.value.observed_value is declined
    assert calls == [500]
