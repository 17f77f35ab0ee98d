"""Secrets never reach the ledger in clear: scrubbed from everything an exception carries
before it is cut to length, refused in keys and receipts, digested with a pepper."""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import (
    BusinessError,
    EffectState,
    InvalidArgumentsError,
    InvalidReceiptError,
    OpenOnce,
    OutcomeUnknownError,
    ResultUnavailableError,
)

S = EffectState
PEPPER = b"pepper-for-tests-0123456789abcdef"
CARD = '4242"4242\\4242-ß242'  # quotes, a backslash and non-ASCII: JSON escapes them


class ProviderError(BusinessError):
    pass


def everything(oo: OpenOnce, effect_id: str) -> str:
    effect = oo.get(effect_id)
    return repr(effect) + "".join(repr(line) for line in oo.journal(effect_id))


def test_a_secret_echoed_in_exception_args_and_causes_is_scrubbed(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order, card: order,
               secret_fields=["card"])  # fmt: skip
    def charge(order: str, card: str) -> None:
        try:
            raise ValueError(f"card {card} rejected by the gateway")
        except ValueError as exc:
            raise ProviderError("declined", {"card": card, "nested": [card, 1]}) from exc

    with pytest.raises(ProviderError):
        charge("o1", CARD)
    effect = oo.store.find("stripe.charge", "o1")
    assert effect is not None and effect.state == S.FAILED
    assert CARD not in everything(oo, effect.id)
    assert effect.error["args"] == ["declined", {"card": "[secret]", "nested": ["[secret]", 1]}]
    assert "[secret]" in effect.error["causes"][0]["message"]


def test_a_secret_across_the_cut_is_scrubbed_before_the_cut(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="t", idempotency_key=lambda order, card: order, secret_fields=["card"])
    def charge(order: str, card: str) -> None:
        raise TimeoutError("x" * 1990 + card + " after")  # the card straddles 2,000 chars

    with pytest.raises(OutcomeUnknownError):
        charge("o1", "4000056655665556")
    effect = oo.store.find("t", "o1")
    assert effect is not None
    assert "40000566" not in everything(oo, effect.id)


def test_a_key_function_that_embeds_a_secret_is_refused(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)
    runs: list[str] = []

    @oo.effect(tool="t", idempotency_key=lambda card, amount: f"pay-{card}", secret_fields=["card"])
    def pay(card: str, amount: int) -> None:
        runs.append(card)

    with pytest.raises(InvalidArgumentsError, match="secret field in clear"):
        pay("4242424242424242", 5)
    assert runs == [] and store.list_effects() == []


def test_a_receipt_holding_a_secret_is_not_stored_and_says_why_on_replay(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="t", idempotency_key=lambda order, card: order, secret_fields=["card"])
    def pay(order: str, card: str) -> dict[str, Any]:
        return {"id": "pi_1", "card": card}  # a careless handler echoes the card

    assert pay("o1", "4242424242424242") == {"id": "pi_1", "card": "4242424242424242"}
    effect = oo.store.find("t", "o1")
    assert effect is not None and effect.state == S.COMMITTED and effect.result is None
    assert "4242424242424242" not in everything(oo, effect.id)
    with pytest.raises(ResultUnavailableError, match="secret field"):
        pay("o1", "4242424242424242")


def test_a_persons_receipt_with_a_secret_in_clear_is_refused(store):
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="t", idempotency_key=lambda order, pin: order, secret_fields=["pin"])
    def pay(order: str, pin: str) -> None:
        raise TimeoutError("read timed out")

    with pytest.raises(OutcomeUnknownError) as unknown:
        pay("o1", "123456")
    effect_id = unknown.value.effect_id
    before = (oo.get(effect_id), oo.journal(effect_id))
    with pytest.raises(InvalidReceiptError, match="secret fields in clear"):
        oo.resolve_happened(effect_id, receipt={"ref": "r1", "pin": "123456"}, by="eve")
    assert (oo.get(effect_id), oo.journal(effect_id)) == before
    assert oo.resolve_happened(effect_id, receipt={"ref": "r1"}, by="eve").state == S.COMMITTED


def test_an_absurd_integer_in_a_receipt_is_refused_not_a_crash(store):
    oo = OpenOnce(store)

    @oo.effect(tool="t", idempotency_key=lambda order: order)
    def pay(order: str) -> None:
        raise TimeoutError("read timed out")

    with pytest.raises(OutcomeUnknownError) as unknown:
        pay("o1")
    effect_id = unknown.value.effect_id
    with pytest.raises(InvalidReceiptError, match="100 digits"):
        oo.resolve_happened(effect_id, receipt={"amount": 10**5000}, by="eve")
    assert oo.get(effect_id).state == S.UNKNOWN
