"""A person's receipt is bound to the effect's identity exactly as a probe's is.

``resolve_happened`` refuses a receipt whose identifying fields (provider key, Stripe
metadata, the expected Message-ID, a PR's owner/repo/head) contradict the effect's own
with ReceiptIdentityError, changing nothing; ``override_identity=True`` with a reason
commits it and journals the override and what it overrode. On every store.
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
from openonce_core._providers import BUILTIN_CAPABILITIES, receipt_identity_problems


def _unknown(oo: OpenOnce, tool: str, **args: Any) -> str:
    """One call of ``tool`` whose reply was lost: an UNKNOWN effect."""

    def handler(**_: Any) -> Any:
        raise UnknownOutcomeError("the reply was lost")

    # The decorator binds arguments by the handler's signature: give it their names.
    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in args]
    )
    fn = oo.effect(handler, tool=tool, idempotency_key=lambda **a: "k-" + repr(sorted(a.items())))
    with pytest.raises(OutcomeUnknownError) as unknown:
        fn(**args)
    return unknown.value.effect_id


def _caps(tool: str) -> list[Any]:
    return [c for c in BUILTIN_CAPABILITIES if c.matches(tool)]


def test_identity_rules_name_each_contradiction() -> None:
    def problems(tool: str, receipt: dict[str, Any], args: Any = None) -> list[str]:
        return receipt_identity_problems(
            _caps(tool), receipt, effect_id="eff_1", provider_key="pk1", args=args or {}
        )

    assert problems("email.send", {"message_id": "<pk1@mail.example>"}) == []
    assert problems("email.send", {"message_id": " <pk1@x> "}) == []
    [wrong] = problems("email.send", {"message_id": "<someone-else@mail.example>"})
    assert "someone-else" in wrong and "<pk1@...>" in wrong
    assert problems("email.send", {"message_id": "pk1@mail.example"})  # no angle brackets
    assert problems("email.send", {"message_id": 7})
    # Stripe metadata stamps, and the generic names.
    assert problems("stripe.charge", {"stripe_id": "pi_1", "metadata": {}}) == []
    [meta] = problems(
        "stripe.charge", {"stripe_id": "pi_1", "metadata": {"openonce_provider_key": "pk2"}}
    )
    assert meta.startswith("metadata.openonce_provider_key is 'pk2'")
    assert problems("stripe.charge", {"stripe_id": "pi_1", "openonce_effect_id": "eff_2"})
    assert problems("ledger.sync", {"effect_id": "eff_9"})  # whatever the tool
    # A PR's natural key and its URL.
    args = {"owner": "acme", "repo": "api", "head": "fix"}
    ok = {"number": 4, "head": "fix", "html_url": "https://github.com/acme/api/pull/4"}
    assert problems("github.create_pr", ok, args) == []
    assert problems("github.create_pr", {**ok, "repo": "web"}, args) == [
        "repo is 'web' but this call's is 'api'"
    ]
    [url] = problems(
        "github.create_pr", {**ok, "html_url": "https://github.com/evil/api/pull/4"}, args
    )
    assert "evil/api" in url
    # A message_id on a tool with no Message-ID contract is not an identity claim.
    assert problems("ledger.sync", {"message_id": "<anything@x>"}) == []


def test_a_receipt_naming_another_message_is_refused_and_nothing_changes(store) -> None:
    oo = OpenOnce(store)
    effect_id = _unknown(oo, "email.send", to="a@example.com")
    before = oo.get(effect_id)
    journal_before = oo.journal(effect_id)

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(
            effect_id, receipt={"message_id": "<someone-else@mail.example>"}, by="eric"
        )

    assert isinstance(refused.value, InvalidReceiptError)
    assert refused.value.effect_id == effect_id
    assert "someone-else" in str(refused.value) and "Nothing was committed" in str(refused.value)
    after = oo.get(effect_id)
    assert (after.state, after.fence, after.result) == (before.state, before.fence, before.result)
    assert oo.journal(effect_id) == journal_before


def test_an_override_needs_a_reason_and_is_journaled(store) -> None:
    oo = OpenOnce(store)
    effect_id = _unknown(oo, "email.send", to="a@example.com")
    receipt = {"message_id": "<relayed-123@mail.example>"}

    with pytest.raises(ValueError, match="reason"):
        oo.resolve_happened(effect_id, receipt=receipt, by="eric", override_identity=True)
    assert oo.get(effect_id).state == "unknown"

    done = oo.resolve_happened(
        effect_id,
        receipt=receipt,
        by="eric",
        reason="the relay rewrote the Message-ID; matched by subject and time",
        override_identity=True,
    )

    assert done.state == "committed" and done.result == receipt
    last, verdict = oo.journal(effect_id)[-2:]  # the receipt, then its check (one commit)
    assert last.actor == "operator:eric" and last.action == "resolve_happened"
    assert verdict.to_state == "committed"
    assert "relay rewrote" in last.reason
    [problem] = last.evidence["identity_override"]
    assert "relayed-123" in problem


def test_a_matching_receipt_needs_no_override(store) -> None:
    oo = OpenOnce(store)
    effect_id = _unknown(oo, "email.send", to="a@example.com")
    key = oo.get(effect_id).provider_key

    done = oo.resolve_happened(effect_id, receipt={"message_id": f"<{key}@mail.example>"}, by="e")

    assert done.state == "committed"
    assert "identity_override" not in oo.journal(effect_id)[-2].evidence


def test_a_receipt_names_one_object_of_the_tools_kind() -> None:
    from openonce_core._providers import receipt_object_problems

    def problems(tool: str, receipt: dict[str, Any]) -> list[str]:
        return receipt_object_problems(tool, _caps(tool), receipt)

    assert problems("stripe.refund", {"stripe_id": "re_1"}) == []
    assert problems("stripe.refund", {"stripe_id": "pyr_1"}) == []
    assert problems("stripe.charge", {"stripe_id": "pi_3Nx"}) == []
    assert problems("stripe.charge", {"stripe_id": "cs_test_a1"}) == []
    [kind] = problems("stripe.refund", {"stripe_id": "pi_demo1"})
    assert "is not a refund" in kind and "re_" in kind
    assert "is a refund" in problems("stripe.charge", {"stripe_id": "re_1"})[0]
    for bad in ("pi_1, pi_2", "pi_1 pi_2", "pi_1_secret_abc", "pi_", 7):
        assert problems("stripe.charge", {"stripe_id": bad}), bad
    assert problems("email.send", {"message_id": "<a@d>"}) == []
    assert "more than one" in problems("email.send", {"message_id": "<a@d>, <b@d>"})[0]
    assert problems("email.send", {"message_id": "<a@d><b@d>"})
    assert problems("email.send", {"message_id": "<a b@d>"})
    assert problems("github.create_pr", {"number": 7, "head": "x"}) == []
    for bad_number in ("7", 0, True, 7.0):
        assert problems("github.create_pr", {"number": bad_number, "head": "x"}), bad_number
    # A tool with no such contract makes no such claim.
    assert problems("ledger.sync", {"stripe_id": "anything, really"}) == []


def test_identities_a_receipt_claims() -> None:
    from openonce_core._providers import receipt_identities, tool_prefix

    [stripe] = receipt_identities(_caps("stripe.charge"), {"stripe_id": "pi_1"}, {})
    assert (stripe.field, stripe.value, stripe.label) == ("stripe_id", "pi_1", "Stripe object pi_1")
    # email.send matches two capabilities: one identity.
    [mail] = receipt_identities(_caps("email.send"), {"message_id": " <k@d> "}, {})
    assert mail.value == "<k@d>"
    args = {"owner": "acme", "repo": "api", "head": "x"}
    [pr] = receipt_identities(_caps("github.create_pr"), {"number": 7, "head": "x"}, args)
    assert pr.label == "pull request acme/api#7"
    assert pr.scope == (("owner", "acme"), ("repo", "api"))
    assert tool_prefix("stripe.*") == "stripe." and tool_prefix("email.send") == "email.send"
