"""A person's receipt names exactly one provider object, of the right kind, that no other
effect already holds, and neither it nor a person's reason carries a secret in clear.

* a provider identity (Stripe object id, a PR of owner/repo, a Message-ID) committed on
  another effect is refused with ReceiptIdentityError naming that effect; an override
  with a reason commits it and journals what it overrode;
* the object's kind must fit the tool (a refund's receipt is a ``re_`` object), and one
  receipt names one object (one Message-ID): refused, override or not;
* a secret field's value inside a longer receipt value, or inside a reason, is refused.

On every store.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from openonce_core import (
    InvalidReceiptError,
    OpenOnce,
    OutcomeUnknownError,
    ReceiptIdentityError,
    UnknownOutcomeError,
)

PEPPER = b"receipt-verdicts-pepper-0123456789"
CARD = "4242424242424242"
API_KEY = "sk_live_51Hx9AbCdEf"


def _effect(
    oo: OpenOnce,
    tool: str,
    outcome: Any = None,
    *,
    secret_fields: tuple[str, ...] = (),
    **args: Any,
) -> str:
    """One call of ``tool``: committed with ``outcome`` as its receipt, or UNKNOWN (None)."""

    def handler(**_: Any) -> Any:
        if outcome is None:
            raise UnknownOutcomeError("the reply was lost")
        return outcome

    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in args]
    )
    key = "k-" + repr(sorted((k, v) for k, v in args.items() if k not in secret_fields))
    fn = oo.effect(handler, tool=tool, idempotency_key=lambda **_: key, secret_fields=secret_fields)
    try:
        fn(**args)
    except OutcomeUnknownError as unknown:
        return unknown.effect_id
    found = oo.store.find(tool, key)
    assert found is not None
    return found.id


def _unchanged(oo: OpenOnce, effect_id: str) -> tuple[Any, ...]:
    effect = oo.get(effect_id)
    return (effect.state, effect.fence, effect.result, len(oo.journal(effect_id)))


# -- one provider object is the receipt of at most one effect -----------------------------


def test_a_stripe_object_committed_on_another_effect_is_refused(store) -> None:
    oo = OpenOnce(store)
    paid = _effect(oo, "stripe.charge", {"stripe_id": "pi_demo1"}, order="o-1")
    other = _effect(oo, "stripe.charge", order="o-2")
    before = _unchanged(oo, other)

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(other, receipt={"stripe_id": "pi_demo1"}, by="olga")

    assert paid in str(refused.value) and "pi_demo1" in str(refused.value)
    assert "Nothing was committed" in str(refused.value)
    assert _unchanged(oo, other) == before
    # Its own, unused object commits.
    assert oo.resolve_happened(other, receipt={"stripe_id": "pi_demo2"}, by="olga").state == (
        "committed"
    )


def test_a_refund_reusing_another_refund_across_tools_is_refused(store) -> None:
    oo = OpenOnce(store)
    # The same Stripe account behind two tool names: the identity is Stripe's, not the tool's.
    first = _effect(oo, "stripe.refund", {"stripe_id": "re_77"}, charge="ch_1", amount=5)
    second = _effect(oo, "stripe.partial_refund", charge="ch_1", amount=6)

    with pytest.raises(ReceiptIdentityError, match=first):
        oo.resolve_happened(second, receipt={"stripe_id": "re_77"}, by="olga")
    assert oo.get(second).state == "unknown"


def test_an_override_with_a_reason_commits_a_reused_identity_and_journals_it(store) -> None:
    oo = OpenOnce(store)
    paid = _effect(oo, "stripe.charge", {"stripe_id": "pi_shared"}, order="o-1")
    other = _effect(oo, "stripe.charge", order="o-2")

    with pytest.raises(ValueError, match="reason"):
        oo.resolve_happened(
            other, receipt={"stripe_id": "pi_shared"}, by="ada", override_identity=True
        )
    assert oo.get(other).state == "unknown"

    done = oo.resolve_happened(
        other,
        receipt={"stripe_id": "pi_shared"},
        by="ada",
        reason="one PaymentIntent paid both orders (support ticket 4411)",
        override_identity=True,
    )

    assert done.state == "committed"
    line = oo.journal(other)[-2]
    assert (line.action, line.actor) == ("resolve_happened", "operator:ada")
    assert "support ticket 4411" in line.reason
    [overridden] = line.evidence["identity_override"]
    assert "pi_shared" in overridden and paid in overridden


def test_a_pr_committed_on_another_effect_is_refused_but_not_one_of_another_repo(store) -> None:
    oo = OpenOnce(store)
    _effect(
        oo, "github.create_pr", {"number": 7, "head": "fix-a"}, owner="acme", repo="api",
        head="fix-a",
    )  # fmt: skip
    other = _effect(oo, "github.create_pr", owner="acme", repo="api", head="fix-b")
    elsewhere = _effect(oo, "github.create_pr", owner="acme", repo="web", head="fix-b")

    with pytest.raises(ReceiptIdentityError, match="acme/api#7"):
        oo.resolve_happened(other, receipt={"number": 7, "head": "fix-b"}, by="olga")
    # PR 7 of another repository is another pull request.
    assert oo.resolve_happened(elsewhere, receipt={"number": 7, "head": "fix-b"}, by="o").state == (
        "committed"
    )


def test_a_message_id_committed_on_another_effect_is_refused(store) -> None:
    oo = OpenOnce(store)
    sent = _effect(oo, "email.send", to="a@example.com")
    key = oo.get(sent).provider_key
    oo.resolve_happened(sent, receipt={"message_id": f"<{key}@mail.example>"}, by="olga")
    twin = _effect(oo, "email.send", to="b@example.com")

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(twin, receipt={"message_id": f"<{key}@mail.example>"}, by="olga")
    assert sent in str(refused.value)


# -- the object's kind and one object per receipt -----------------------------------------


def test_a_payment_intent_is_not_a_refund(store) -> None:
    oo = OpenOnce(store)
    refund = _effect(oo, "stripe.refund", charge="ch_1", amount=500)
    before = _unchanged(oo, refund)

    for override in (False, True):
        with pytest.raises(InvalidReceiptError) as refused:
            oo.resolve_happened(
                refund, receipt={"stripe_id": "pi_demo1"}, by="ada", reason="sure",
                override_identity=override,
            )  # fmt: skip
        assert not isinstance(refused.value, ReceiptIdentityError)  # no override for this
        assert "stripe.refund" in str(refused.value) and "re_" in str(refused.value)
        assert "pi_demo1" in str(refused.value)
    assert _unchanged(oo, refund) == before
    # And a refund is not a charge's receipt.
    charge = _effect(oo, "stripe.charge", order="o-9")
    with pytest.raises(InvalidReceiptError, match="refund"):
        oo.resolve_happened(charge, receipt={"stripe_id": "re_1"}, by="ada")
    assert oo.resolve_happened(refund, receipt={"stripe_id": "re_9"}, by="ada").state == (
        "committed"
    )


@pytest.mark.parametrize("stripe_id", ["pi_1, pi_2", "pi_1 pi_2", " ", "not an id", "pi_"])
def test_a_stripe_id_must_name_one_object(store, stripe_id: str) -> None:
    oo = OpenOnce(store)
    effect_id = _effect(oo, "stripe.charge", order="o-1")
    with pytest.raises(InvalidReceiptError, match="one Stripe object id"):
        oo.resolve_happened(
            effect_id, receipt={"stripe_id": stripe_id}, by="ada", reason="r",
            override_identity=True,
        )  # fmt: skip
    assert oo.get(effect_id).state == "unknown"


def test_a_receipt_listing_two_message_ids_is_refused_even_with_an_override(store) -> None:
    oo = OpenOnce(store)
    mine = _effect(oo, "email.send", to="a@example.com")
    other = _effect(oo, "email.send", to="b@example.com")
    own, theirs = oo.get(mine).provider_key, oo.get(other).provider_key
    before = _unchanged(oo, mine)

    for value in (
        f"<{own}@mail.example>, <{theirs}@mail.example>",
        f"<{own}@mail.example> <{theirs}@mail.example>",
        f"<{own}@mail.example><{theirs}@mail.example>",
    ):
        for override in (False, True):
            with pytest.raises(InvalidReceiptError, match="one Message-ID"):
                oo.resolve_happened(
                    mine, receipt={"message_id": value}, by="ada", reason="both went out",
                    override_identity=override,
                )  # fmt: skip
    assert _unchanged(oo, mine) == before


# -- secrets inside longer values ---------------------------------------------------------


def _secret_effect(oo: OpenOnce) -> str:
    return _effect(
        oo, "stripe.charge", order="o-1", card=CARD, api_key=API_KEY,
        secret_fields=("card", "api_key"),
    )  # fmt: skip


@pytest.mark.parametrize(
    "note",
    [
        f"charged card {CARD} at 10:02",
        "card 4242 4242 4242 4242, exp 12/30",
        "card=4242-4242-4242-4242;",
        f"used key={API_KEY}.",
        f"(key {API_KEY})",
    ],
)
def test_a_secret_inside_a_longer_receipt_value_is_refused(store, note: str) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)
    effect_id = _secret_effect(oo)
    before = _unchanged(oo, effect_id)

    with pytest.raises(InvalidReceiptError, match="secret") as refused:
        oo.resolve_happened(effect_id, receipt={"stripe_id": "pi_1", "note": note}, by="ada")

    assert CARD not in str(refused.value) and API_KEY not in str(refused.value)
    assert _unchanged(oo, effect_id) == before


def test_a_secret_inside_a_reason_is_refused_for_every_decision(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)
    effect_id = _secret_effect(oo)
    before = _unchanged(oo, effect_id)
    reason = f"customer read the card out: {CARD[:4]} {CARD[4:8]} {CARD[8:12]} {CARD[12:]}"

    with pytest.raises(ValueError, match="secret"):
        oo.resolve_happened(effect_id, receipt={"stripe_id": "pi_1"}, by="ada", reason=reason)
    with pytest.raises(ValueError, match="secret"):
        oo.resolve_not_happened(effect_id, by="ada", reason=f"key {API_KEY} was revoked")
    assert _unchanged(oo, effect_id) == before

    # Re-armed (PLANNED), so it can be cancelled: a cancel's reason is read too.
    done = oo.resolve_not_happened(effect_id, by="ada", reason="no payment for this order")
    assert done.state == "planned"
    with pytest.raises(ValueError, match="secret"):
        oo.cancel(effect_id, by="ada", reason=f"duplicate of card {CARD}")
    assert oo.get(effect_id).state == "planned"


def test_near_misses_of_a_secret_are_not_refused(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)
    effect_id = _secret_effect(oo)
    note = f"card ending {CARD[-4:]}; key {API_KEY[:10]}…; amount 4242"
    done = oo.resolve_happened(
        effect_id, receipt={"stripe_id": "pi_1", "note": note}, by="ada", reason="seen: 4242"
    )
    assert done.state == "committed"


def test_a_secret_passed_as_a_number_or_used_as_a_name_is_refused(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)
    effect_id = _effect(oo, "stripe.charge", order="o-n", pin=987654, secret_fields=("pin",))
    for receipt in (
        {"stripe_id": "pi_1", "note": "pin 987-654 entered"},
        {"stripe_id": "pi_1", "seen": {"987654": True}},  # a name, not a value
    ):
        with pytest.raises(InvalidReceiptError, match="secret"):
            oo.resolve_happened(effect_id, receipt=receipt, by="ada")
    assert oo.get(effect_id).state == "unknown"


def test_short_secrets_count_whole_and_huge_values_do_not_crash(store) -> None:
    oo = OpenOnce(store, secret_pepper=PEPPER)
    effect_id = _effect(oo, "stripe.charge", order="o-c", cvc="123", secret_fields=("cvc",))
    # A 3-character secret as a whole value is refused ...
    with pytest.raises(InvalidReceiptError, match="secret"):
        oo.resolve_happened(effect_id, receipt={"stripe_id": "pi_1", "cvc": "123"}, by="ada")
    # ... but inside longer text it is too common to refuse on; a 20,000-digit run is text.
    done = oo.resolve_happened(
        effect_id,
        receipt={"stripe_id": "pi_123", "note": "ref 123-9", "blob": "7" * 20_000},
        by="ada",
    )
    assert done.state == "committed"


def test_the_store_lookup_matches_the_prefix_and_the_json_type_exactly(store) -> None:
    oo = OpenOnce(store)
    mine = _effect(oo, "pay_ment.charge", {"ref": 7}, order="a")
    _effect(oo, "payXment.charge", {"ref": 7}, order="b")  # "_" is no wildcard here
    _effect(oo, "pay_ment.charge", {"ref": "7"}, order="c")  # "7" is not 7
    _effect(oo, "pay_ment.charge", order="d")  # UNKNOWN: holds nothing

    found = store.committed_receipts_naming("pay_ment.", "ref", 7)
    assert [e.id for e in found] == [mine]
    assert store.committed_receipts_naming("pay_ment.", "ref", 7, exclude=mine) == []
    with pytest.raises(ValueError, match="plain field name"):
        store.committed_receipts_naming("pay_ment.", "ref') OR ('1", 7)
