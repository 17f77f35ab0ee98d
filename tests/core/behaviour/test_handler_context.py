"""What a handler knows about its effect.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import (
    OpenOnce,
    OpenOnceError,
    OutcomeUnknownError,
    UnknownOutcomeError,
    current_effect,
)


def test_current_effect_is_stable_across_retries_and_attempts(store):
    oo = OpenOnce(store, retry_delay=0)
    seen: list[Any] = []
    outcomes: list[Any] = [
        ConnectionRefusedError("refused"),
        UnknownOutcomeError("reply lost"),
        "ok",
    ]

    @oo.effect(tool="stripe.charge", max_attempts=3)
    def charge(amount_cents: int) -> str:
        seen.append(current_effect())
        outcome = outcomes.pop(0) if outcomes else "ok"
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    with oo.scope("run-1") as run_id:
        with pytest.raises(OutcomeUnknownError) as info:
            charge(500)  # attempt 1 retried, attempt 2 lost its reply
        effect_id = info.value.effect_id
        oo.resolve_not_happened(effect_id, by="eric", reason="no charge in dashboard")
        assert charge(500) == "ok"  # attempt 3
    effect = oo.get(effect_id)
    assert [ctx.attempt for ctx in seen] == [1, 2, 3]
    assert {ctx.effect_id for ctx in seen} == {effect_id}
    assert {ctx.provider_key for ctx in seen} == {effect.provider_key}
    assert effect.provider_key.startswith("oo_")
    assert {ctx.tool for ctx in seen} == {"stripe.charge"}
    assert {ctx.scope for ctx in seen} == {run_id}
    assert {ctx.idempotency_key for ctx in seen} == {effect.idempotency_key}
    with oo.scope("run-1"):
        charge(600)
    assert seen[-1].provider_key != effect.provider_key  # another effect, another key


def test_current_effect_outside_a_handler_raises(store):
    OpenOnce(store, retry_delay=0)
    with pytest.raises(OpenOnceError, match="only available inside"):
        current_effect()
