"""A ledger write that fails after the call.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

import time

import pytest

from openonce_core import (
    EffectInFlightError,
    LeaseLostError,
    LedgerWriteError,
    OpenOnce,
    OutcomeUnknownError,
)

from .helpers import (
    CardDeclined,
    CommitFailsStore,
    S,
    only_effect,
)


def test_failed_finishing_write_raises_ledger_write_error_and_never_reruns(store):
    oo = OpenOnce(CommitFailsStore(store), retry_delay=0, lease_seconds=0.3, wait_seconds=0.05)
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
    with pytest.raises(EffectInFlightError):
        send("a@b.c")  # lease still live: a duplicate waits, then gives up
    time.sleep(0.4)
    with pytest.raises(OutcomeUnknownError):
        send("a@b.c")  # lease ran out: UNKNOWN, not a second send
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
