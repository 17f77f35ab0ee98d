"""Round 3 review (R2): a provider object already committed on another effect is found
however that effect's receipt or arguments spell it, and two people committing the same
object at once do not both succeed.

* a pull request held as ``"7"``, ``"#7"`` or ``" 7 "`` in another effect's receipt is
  the PR a person types as 7; ``Acme/API`` is GitHub's ``acme/api``;
* a Stripe id held with stray whitespace is the same object;
* the identity is checked again after the provider check (which can take seconds), so a
  second person committing the same object meanwhile is refused.

On every store.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from test_receipt_verdicts import _effect, _unchanged

from openonce_core import OpenOnce, ReceiptIdentityError
from openonce_core._decisions import ProviderCheck


@pytest.mark.parametrize("held", ["7", "#7", " 7 ", "007"])
def test_a_pr_held_as_text_is_the_pr_a_person_types_as_a_number(store, held: Any) -> None:
    oo = OpenOnce(store)
    holder = _effect(oo, "github.create_pr", {"number": held}, owner="acme", repo="api", head="a")
    other = _effect(oo, "github.create_pr", owner="acme", repo="api", head="b")
    before = _unchanged(oo, other)

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(other, receipt={"number": 7}, by="olga")

    assert holder in str(refused.value)
    assert _unchanged(oo, other) == before
    # PR 70 is another PR.
    assert oo.resolve_happened(other, receipt={"number": 70}, by="olga").state == "committed"


def test_owner_and_repo_name_one_repository_whatever_their_case(store) -> None:
    oo = OpenOnce(store)
    holder = _effect(oo, "github.create_pr", {"number": 7}, owner="acme", repo="api", head="a")
    other = _effect(oo, "github.create_pr", owner="Acme", repo="API", head="b")

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(other, receipt={"number": 7}, by="olga")

    assert holder in str(refused.value)
    assert oo.get(other).state != "committed"


def test_a_stripe_id_held_with_stray_whitespace_is_the_same_object(store) -> None:
    oo = OpenOnce(store)
    holder = _effect(oo, "stripe.charge", {"stripe_id": " pi_demo1\n"}, order="o-1")
    other = _effect(oo, "stripe.charge", order="o-2")

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(other, receipt={"stripe_id": "pi_demo1"}, by="olga")

    assert holder in str(refused.value)


def test_two_people_committing_one_object_at_once_do_not_both_succeed(store) -> None:
    """Two tabs, two effects, one Stripe object: each passes the ledger's checks, then
    waits on the provider; the one that answers second must find the first's commit."""
    oo = OpenOnce(store)
    first = _effect(oo, "stripe.charge", order="o-1")
    second = _effect(oo, "stripe.charge", order="o-2")
    both_asking = threading.Barrier(2, timeout=10)
    first_done = threading.Event()

    def provider(effect: Any, receipt: dict[str, Any]) -> ProviderCheck:
        both_asking.wait()  # both passed the identity check before either commits
        if effect.id == second:
            first_done.wait(10)  # the second answer comes after the first committed
        return ProviderCheck(True, "stripe confirmed it")

    outcomes: dict[str, Any] = {}

    def resolve(effect_id: str) -> None:
        try:
            oo.resolve_happened(
                effect_id, receipt={"stripe_id": "pi_shared"}, by="olga", verify=provider
            )
            outcomes[effect_id] = "committed"
        except ReceiptIdentityError as exc:
            outcomes[effect_id] = exc
        finally:
            if effect_id == first:
                first_done.set()

    threads = [threading.Thread(target=resolve, args=(e,)) for e in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert outcomes[first] == "committed"
    assert isinstance(outcomes[second], ReceiptIdentityError), outcomes
    assert first in str(outcomes[second])
    assert oo.get(second).state != "committed"


def test_a_pr_held_as_a_json_float_is_still_that_pr(store) -> None:
    oo = OpenOnce(store)
    holder = _effect(oo, "github.create_pr", {"number": 7.0}, owner="acme", repo="api", head="a")
    other = _effect(oo, "github.create_pr", owner="acme", repo="api", head="b")

    with pytest.raises(ReceiptIdentityError) as refused:
        oo.resolve_happened(other, receipt={"number": 7}, by="olga")

    assert holder in str(refused.value)


# -- redact_text: shapes a provider's or a library's error text really takes --------------

GITHUB_CLASSIC = "0123456789abcdef0123456789abcdef01234567"  # a 40-hex OAuth token


@pytest.mark.parametrize(
    "text",
    [
        f"headers={{'Authorization': 'token {GITHUB_CLASSIC}'}}",  # a dict's repr
        f'{{"authorization": "token {GITHUB_CLASSIC}"}}',  # JSON
        f"Authorization: token {GITHUB_CLASSIC}",
    ],
)
def test_a_quoted_authorization_header_is_redacted(text: str) -> None:
    from openonce_core._redact import redact_text

    assert GITHUB_CLASSIC not in redact_text(text)
    assert "[secret]" in redact_text(text)


@pytest.mark.parametrize(
    "text",
    ["card 4242.4242.4242.4242 declined", "card 4242\u00a04242\u00a04242\u00a04242 declined"],
)
def test_a_card_grouped_with_dots_or_no_break_spaces_is_redacted(text: str) -> None:
    from openonce_core._redact import redact_text

    assert "4242" not in redact_text(text) and "[secret]" in redact_text(text)


def test_numbers_with_dots_that_are_no_card_stay() -> None:
    from openonce_core._redact import redact_text

    for text in ("v1.2.3", "10.0.0.12", "amount 1234.56", "192.168.100.200:443"):
        assert redact_text(text) == text
