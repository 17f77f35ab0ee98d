"""Replay: a finished effect answers its duplicates without running again.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from openonce_core import (
    BusinessError,
    EffectFailed,
    OpenOnce,
    OutcomeUnknownError,
    ResultUnavailableError,
)

from .helpers import (
    AGENT,
    OWNER,
    CardDeclined,
    S,
    moves,
    only_effect,
)


def test_results_replay_without_calling_the_handler(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(tool="github.create_issue")
    def create_issue(title: str) -> dict[str, Any]:
        calls.append(title)
        return {"number": 42, "labels": ["bug"], "draft": False, "meta": None}

    with oo.scope():
        results = [create_issue("Login broken") for _ in range(3)]
    assert results == [{"number": 42, "labels": ["bug"], "draft": False, "meta": None}] * 3
    assert calls == ["Login broken"]
    assert oo.stats["executed"] == 1
    assert oo.stats["replayed"] == 2
    effect = only_effect(store)
    assert len(oo.journal(effect.id)) == 2  # a replay writes nothing


def test_business_error_is_recorded_failed_and_replayed(store):
    oo = OpenOnce(store, retry_delay=0, max_attempts=3, owner=OWNER)
    calls: list[int] = []

    # A ValueError alone would be UNKNOWN (it may come from reading the provider's reply);
    # this tool declares it the provider's "no".
    @oo.effect(tool="stripe.charge", business_errors=(ValueError,))
    def charge(amount_cents: int) -> dict[str, Any]:
        calls.append(amount_cents)
        raise ValueError("card declined")

    with oo.scope():
        with pytest.raises(ValueError, match=r"^card declined$"):
            charge(500)
        with pytest.raises(ValueError, match=r"^card declined$") as replayed:
            charge(500)
    assert calls == [500]  # a business error is final: not retried, not re-run
    assert type(replayed.value) is ValueError
    assert replayed.value.openonce_replayed is True
    effect = only_effect(store)
    assert effect.state == S.FAILED
    assert replayed.value.openonce_effect_id == effect.id
    assert effect.error["type"] == "builtins.ValueError"
    assert effect.error["message"] == "card declined"
    assert moves(oo, effect.id) == [(S.PLANNED, S.STARTED), (S.STARTED, S.FAILED)]
    last = oo.journal(effect.id)[-1]
    assert last.actor == AGENT
    assert last.reason == "ValueError: declared a business error"
    assert last.evidence["error"]["message"] == "card declined"
    assert oo.stats["failed"] == 1
    assert oo.stats["replayed"] == 1


def test_custom_business_error_replays_as_its_own_class_with_its_args(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise CardDeclined("insufficient_funds", 402)

    with oo.scope():
        with pytest.raises(CardDeclined) as first:
            charge(500)
        with pytest.raises(CardDeclined) as again:
            charge(500)
    assert calls == [500]
    assert again.value.args == first.value.args == ("insufficient_funds", 402)
    assert again.value is not first.value


def test_failure_of_a_class_that_cannot_be_rebuilt_replays_as_effect_failed(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    class LocalDecline(BusinessError):
        pass

    @oo.effect
    def charge(amount_cents: int) -> None:
        calls.append(amount_cents)
        raise LocalDecline("do not honor")

    with oo.scope():
        with pytest.raises(LocalDecline):
            charge(500)
        with pytest.raises(EffectFailed) as replayed:
            charge(500)
    assert calls == [500]
    assert replayed.value.error_type.endswith("LocalDecline")
    assert "do not honor" in str(replayed.value)
    assert replayed.value.effect_id == only_effect(store).id


def test_a_result_that_is_not_json_commits_but_cannot_be_replayed(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[str] = []

    @oo.effect(idempotency_key=lambda to: f"mail-{to}")
    def send(to: str) -> Any:
        calls.append(to)
        return date(2026, 7, 2)

    assert send("a@b.c") == date(2026, 7, 2)  # the first caller gets the real value
    with pytest.raises(ResultUnavailableError, match="date"):
        send("a@b.c")
    assert calls == ["a@b.c"]
    effect = only_effect(store)
    assert effect.state == S.COMMITTED
    assert effect.execution_evidence["result_unavailable"] == "date"


def test_interrupted_handler_parks_unknown_and_the_interrupt_propagates(store):
    oo = OpenOnce(store, retry_delay=0)
    calls: list[int] = []

    @oo.effect(idempotency_key=lambda amount_cents: f"c-{amount_cents}")
    def charge(amount_cents: int) -> str:
        calls.append(amount_cents)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return "charged again"  # a blind re-run would get here

    with pytest.raises(KeyboardInterrupt):
        charge(500)
    assert only_effect(store).state == S.UNKNOWN
    with pytest.raises(OutcomeUnknownError):
        charge(500)
    assert calls == [500]
