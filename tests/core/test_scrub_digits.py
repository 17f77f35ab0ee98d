"""A secret written in digits (a card number, a phone number) is scrubbed however the text
groups it: without its dashes, with spaces or dots added, split differently. Before this,
only the exact string was replaced, and ``4242424242424242`` in a gateway's message was
stored in clear for the card ``4242-4242-4242-4242``."""

from __future__ import annotations

import pytest

from openonce_core import BusinessError, EffectState, OpenOnce, OutcomeUnknownError
from openonce_core._failures import contains_secret, scrub

S = EffectState
PEPPER = b"pepper-for-tests-0123456789abcdef"
CARD = "4242-4242-4242-4242"


class GatewayError(BusinessError):
    pass


@pytest.mark.parametrize(
    "text",
    [
        "card 4242424242424242 declined",
        "card 4242 4242 4242 4242 declined",
        "card 4242.4242.4242.4242 declined",
        "card 42424242-42424242 declined",
        "card 4 2 4 2 4 2 4 2 4 2 4 2 4 2 4 2 declined",
        "card 4242\u00a04242\u00a04242\u00a04242 declined",  # no-break spaces
    ],
)
def test_a_digit_secret_is_found_however_it_is_grouped(text: str) -> None:
    assert scrub(text, (CARD,)) == "card [secret] declined"


def test_a_secret_written_together_is_found_grouped() -> None:
    assert scrub("phone +1 (555) 010-9999 busy", ("15550109999",)) == "phone +[secret] busy"
    assert scrub({"n": ["call 555.010.9999"]}, ("555-010-9999",)) == {"n": ["call [secret]"]}


def test_a_digit_secret_as_an_integer_is_scrubbed() -> None:
    assert scrub([4242424242424242, 7], (CARD,)) == ["[secret]", 7]
    assert contains_secret({"card": 4242424242424242}, (CARD,))


def test_other_digits_are_left_alone() -> None:
    text = "order 4242-4242-4242-4241 for 42.42 at 2026-12-02"
    assert scrub(text, (CARD,)) == text
    # A short number is not searched for by its digits (it would match everywhere).
    assert scrub("pin 1-2-3-4", ("1234",)) == "pin 1-2-3-4"
    # A secret with letters is replaced exactly, as before.
    assert scrub("key AB-12-34-56-78 and AB12345678", ("AB-12-34-56-78",)) == (
        "key [secret] and AB12345678"
    )


def test_a_regrouped_card_in_a_failure_never_reaches_the_ledger(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order, card: order,
               secret_fields=["card"])  # fmt: skip
    def charge(order: str, card: str) -> None:
        digits = card.replace("-", "")
        try:
            raise ValueError(f"gateway: card {digits} rejected")
        except ValueError as exc:
            raise GatewayError(
                "declined", {"pan": " ".join(digits[i : i + 4] for i in range(0, 16, 4))}
            ) from exc

    with pytest.raises(GatewayError):
        charge("o1", CARD)
    effect = oo.store.find("stripe.charge", "o1")
    assert effect is not None and effect.state == S.FAILED
    stored = repr(effect) + "".join(repr(line) for line in oo.journal(effect.id))
    assert "4242424242424242" not in stored and "4242 4242" not in stored
    assert effect.error["args"] == ["declined", {"pan": "[secret]"}]
    assert effect.error["causes"][0]["message"] == "gateway: card [secret] rejected"


def test_a_regrouped_card_in_an_unknown_outcome_is_scrubbed(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)

    @oo.effect(tool="t", idempotency_key=lambda order, card: order, secret_fields=["card"])
    def charge(order: str, card: str) -> None:
        raise TimeoutError("x" * 1985 + card.replace("-", "") + " after")  # across the cut

    with pytest.raises(OutcomeUnknownError):
        charge("o1", CARD)
    effect = oo.store.find("t", "o1")
    assert effect is not None
    stored = repr(effect) + "".join(repr(line) for line in oo.journal(effect.id))
    assert "42424242" not in stored
