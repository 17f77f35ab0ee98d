"""A receipt typed in the console is held to what the ledger holds it to, and, where a
prober can look, to what the provider says.

* another effect's provider object, the wrong kind of object, two Message-IDs in one
  receipt, a secret inside a receipt value or a reason: refused, nothing committed; only
  a person holding the override permission may commit a reused identity, with a reason
  the journal keeps;
* with a prober registered that can ``verify(effect, receipt)``, the console asks the
  provider before committing, refuses what it does not confirm (another effect's stamp,
  no such object, could not ask, no answer in time) saying what the provider said, and
  never shows the prober's key.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from test_console_views import (
    CARD,
    PEPPER,
    UNKNOWN,
    Agent,
    client_for,
    decide,
    fresh_ledger,
    html,
    make_users,
    post,
)

from openonce_core._probe import ProbeOutcome, ProbeResult
from openonce_core.errors import ProbeCredentialError, ProbeTransientError

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk_live_51SecretConsoleKey"


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> dict[str, User]:
    return make_users()


def _resolve(client: Any, agent: Agent, effect_id: str, receipt: Any, **fields: Any) -> Any:
    text = receipt if isinstance(receipt, str) else json.dumps(receipt)
    return decide(
        client, "resolve-happened", effect_id, agent.fence(effect_id), receipt=text, **fields
    )


def _snapshot(agent: Agent, effect_id: str) -> tuple[Any, ...]:
    effect = agent.oo.get(effect_id)
    return (effect.state, effect.fence, effect.result, len(agent.journal(effect_id)))


# -- identities, kinds and secrets --------------------------------------------------------


def test_another_effects_stripe_object_is_refused_and_only_an_admin_overrides(
    agent: Agent, users
) -> None:
    paid = agent.call("stripe.charge", {"stripe_id": "pi_demo1"}, order="o-1", amount=500)
    other = agent.unknown("stripe.charge", order="o-2", amount=500)
    before = _snapshot(agent, other)
    operator, admin = client_for(users["operator"]), client_for(users["admin"])

    response = _resolve(operator, agent, other, {"stripe_id": "pi_demo1"}, reason="seen")
    page = html(response)
    assert response.status_code == 400
    assert "This receipt names another effect" in page
    assert f"Stripe object pi_demo1 is already the committed receipt of {paid}" in page
    assert "Nothing was committed" in page
    # An operator does not hold the override: asking for it is a permission denial.
    response = _resolve(
        operator, agent, other, {"stripe_id": "pi_demo1"}, reason="sure", override_identity="on"
    )
    assert response.status_code == 403
    assert _snapshot(agent, other) == before

    # The admin must say why.
    response = _resolve(admin, agent, other, {"stripe_id": "pi_demo1"}, override_identity="on")
    assert response.status_code == 400
    assert "An override needs a reason" in html(response)
    assert _snapshot(agent, other) == before

    response = _resolve(
        admin, agent, other, {"stripe_id": "pi_demo1"}, override_identity="on",
        reason="one PaymentIntent paid both orders; support ticket 4411",
    )  # fmt: skip
    assert response.status_code == 302
    assert agent.state(other) == "committed"
    line = agent.journal(other)[-2]
    assert (line.action, line.actor) == ("resolve_happened", "operator:admin")
    assert "support ticket 4411" in line.reason
    [overridden] = line.evidence["identity_override"]
    assert "pi_demo1" in overridden and paid in overridden


def test_a_payment_intent_is_refused_as_a_refunds_receipt(agent: Agent, users) -> None:
    agent.call("stripe.charge", {"stripe_id": "pi_demo1"}, order="o-1", amount=500)
    refund = agent.call("stripe.refund", UNKNOWN, strict=True, charge="ch_1", amount=500)
    before = _snapshot(agent, refund)

    for user in ("operator", "admin"):
        response = _resolve(
            client_for(users[user]), agent, refund, {"stripe_id": "pi_demo1"},
            reason="matched in the dashboard",
            **({"override_identity": "on"} if user == "admin" else {}),
        )  # fmt: skip
        assert response.status_code == 400
        assert "stripe_id &#x27;pi_demo1&#x27; is not a refund" in html(response)
        assert "start with re_" in html(response)
    assert _snapshot(agent, refund) == before


def test_a_receipt_listing_two_message_ids_is_refused(agent: Agent, users) -> None:
    mine = agent.call("email.send", UNKNOWN, to="a@example.com")
    other = agent.call("email.send", UNKNOWN, to="b@example.com")
    own, theirs = agent.oo.get(mine).provider_key, agent.oo.get(other).provider_key
    before = _snapshot(agent, mine)
    receipt = {"message_id": f"<{own}@mail.example>, <{theirs}@mail.example>"}

    for user in ("operator", "admin"):
        response = _resolve(
            client_for(users[user]), agent, mine, receipt, reason="both went out",
            **({"override_identity": "on"} if user == "admin" else {}),
        )  # fmt: skip
        assert response.status_code == 400
        assert "lists more than one message" in html(response)
    assert _snapshot(agent, mine) == before


@pytest.fixture
def peppered(settings: Any) -> None:
    """The console's ledger client digests secrets with the agents' pepper (as deployed);
    requested before ``agent``, which opens that client."""
    settings.OPENONCE_SECRET_PEPPER = PEPPER.decode()


def test_a_secret_inside_a_receipt_value_or_a_reason_is_refused(
    peppered: None, agent: Agent, users
) -> None:
    effect_id = agent.call(
        "stripe.charge", UNKNOWN, secret_fields=("card",), order="o-s", amount=5, card=CARD
    )
    before = _snapshot(agent, effect_id)
    operator = client_for(users["operator"])
    spaced = " ".join(CARD[i : i + 4] for i in range(0, 16, 4))

    response = _resolve(
        operator, agent, effect_id, {"stripe_id": "pi_5", "note": f"card {spaced} charged"}
    )
    assert response.status_code == 400
    page = html(response)
    assert "The receipt holds the value of one of this effect&#x27;s secret fields" in page
    assert spaced not in page  # the form comes back without what was typed

    response = _resolve(
        operator, agent, effect_id, {"stripe_id": "pi_5"}, reason=f"customer said card={CARD};"
    )
    assert response.status_code == 400
    page = html(response)
    assert "The reason holds the value of one of this effect&#x27;s secret fields" in page
    assert CARD not in page
    # Not even in a receipt that is not JSON, which the page would otherwise show again.
    response = _resolve(operator, agent, effect_id, f'{{"stripe_id": "pi_5", card {CARD}')
    assert response.status_code == 400
    assert CARD not in html(response)
    # The core refuses it too, whatever form a decision comes through.
    response = decide(
        operator, "resolve-not-happened", effect_id, agent.fence(effect_id),
        reason=f"no charge on {spaced}",
    )  # fmt: skip
    assert response.status_code == 409
    assert "the reason holds the value of one of this effect&#x27;s secret fields" in html(response)
    assert _snapshot(agent, effect_id) == before
    assert CARD not in json.dumps([line.reason for line in agent.journal(effect_id)])


# -- asking the provider before committing ------------------------------------------------


class FakeStripeVerifier:
    """A prober that can verify a receipt's object, over a table of Stripe objects (the
    provider, as far as these tests need one). ``verify`` follows the interface: HAPPENED
    only for an object stamped with this effect's provider key."""

    provider = "stripe"

    def __init__(self, objects: dict[str, dict[str, Any]] | None = None) -> None:
        self.objects = objects or {}
        self.verified: list[tuple[str, Any]] = []
        self.fail: Exception | None = None
        self.hold: threading.Event | None = None

    def probe(self, effect: Any) -> ProbeResult:
        return ProbeResult(ProbeOutcome.INCONCLUSIVE, detail="not asked in these tests")

    def verify(self, effect: Any, receipt: Any) -> ProbeResult:
        self.verified.append((effect.id, receipt))
        if self.hold is not None:
            self.hold.wait(30)
        if self.fail is not None:
            raise self.fail
        stripe_id = receipt["stripe_id"]
        found = self.objects.get(stripe_id)
        if found is None:
            return ProbeResult(ProbeOutcome.NOT_HAPPENED, detail=f"no object {stripe_id}")
        stamp = found["metadata"].get("openonce_provider_key")
        if stamp != effect.provider_key:
            return ProbeResult(
                ProbeOutcome.INCONCLUSIVE,
                receipt=found,
                detail=f"{stripe_id} carries the stamp of another effect ({stamp})",
            )
        return ProbeResult(
            ProbeOutcome.HAPPENED,
            receipt=found,
            detail=f"{stripe_id} exists, status {found['status']}, stamped for this effect",
        )


@pytest.fixture
def stripe_verifier(settings: Any, agent: Agent) -> FakeStripeVerifier:
    verifier = FakeStripeVerifier()
    # The reconciler (and so the registered probers) is built on first use, after this.
    settings.OPENONCE_PROBERS = {"stripe.charge": verifier}
    return verifier


def _stamped(agent: Agent, effect_id: str, status: str = "succeeded") -> dict[str, Any]:
    key = agent.oo.get(effect_id).provider_key
    return {"status": status, "metadata": {"openonce_provider_key": key}}


def test_a_receipt_the_provider_confirms_commits_and_the_page_says_so(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier
) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-v", amount=700)
    stripe_verifier.objects["pi_ok"] = _stamped(agent, effect_id)
    client = client_for(users["operator"])
    page = html(client.get(reverse("effect", args=[effect_id])))
    assert "the console asks the provider for the object this receipt names" in page
    assert stripe_verifier.verified == []  # drawing the page asks nobody

    response = _resolve(client, agent, effect_id, {"stripe_id": "pi_ok"}, reason="dashboard")

    assert response.status_code == 302
    assert stripe_verifier.verified == [(effect_id, {"stripe_id": "pi_ok"})]
    assert agent.state(effect_id) == "committed"
    page = html(client.get(response["Location"]))
    assert "stripe confirmed it: pi_ok exists, status succeeded, stamped for this effect" in page
    check = agent.journal(effect_id)[-2].evidence["provider_check"]
    assert check["confirmed"] is True and "stamped for this effect" in check["said"]


@pytest.mark.parametrize(
    ("stripe_id", "said"),
    [
        ("pi_missing", "no object pi_missing"),
        ("pi_theirs", "pi_theirs carries the stamp of another effect (oo_someone_else)"),
    ],
)
def test_a_receipt_the_provider_does_not_confirm_is_refused(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier, stripe_id: str, said: str
) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-n", amount=700)
    stripe_verifier.objects["pi_theirs"] = {
        "status": "succeeded", "metadata": {"openonce_provider_key": "oo_someone_else"},
    }  # fmt: skip
    before = _snapshot(agent, effect_id)

    response = _resolve(client_for(users["operator"]), agent, effect_id, {"stripe_id": stripe_id})

    assert response.status_code == 409
    page = html(response)
    assert "stripe did not confirm this receipt" in page and said in page
    assert "Nothing was committed" in page
    assert _snapshot(agent, effect_id) == before


def test_an_unreachable_provider_refuses_until_an_admin_overrides_with_a_reason(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier
) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-u", amount=700)
    stripe_verifier.fail = ProbeTransientError("stripe", "search answered 503", status=503)
    before = _snapshot(agent, effect_id)

    response = _resolve(client_for(users["operator"]), agent, effect_id, {"stripe_id": "pi_1"})
    assert response.status_code == 409
    page = html(response)
    assert "stripe could not be asked (HTTP 503): search answered 503" in page
    assert "Nothing was committed" in page
    assert _snapshot(agent, effect_id) == before

    response = _resolve(
        client_for(users["admin"]), agent, effect_id, {"stripe_id": "pi_1"},
        override_identity="on", reason="Stripe is down; the dashboard shows pi_1 paid",
    )  # fmt: skip
    assert response.status_code == 302
    assert agent.state(effect_id) == "committed"
    line = agent.journal(effect_id)[-2]
    assert "Stripe is down" in line.reason
    assert any("could not be asked" in p for p in line.evidence["identity_override"])
    assert line.evidence["provider_check"]["confirmed"] is False


def test_the_provider_check_never_shows_the_key(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier, caplog: Any
) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-k", amount=700)
    stripe_verifier.fail = ProbeCredentialError(
        "stripe", f"Invalid API Key provided: {KEY}", status=401
    )

    response = _resolve(client_for(users["operator"]), agent, effect_id, {"stripe_id": "pi_1"})

    assert response.status_code == 409
    page = html(response)
    assert "stripe refused the console&#x27;s credentials (HTTP 401)" in page
    assert KEY not in page and KEY not in caplog.text
    assert agent.state(effect_id) == "unknown"


def test_a_provider_that_does_not_answer_in_time_refuses(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier, monkeypatch: Any
) -> None:
    from console import actions

    monkeypatch.setattr(actions, "VERIFY_TIMEOUT", 0.2)
    effect_id = agent.unknown("stripe.charge", order="o-t", amount=700)
    stripe_verifier.objects["pi_ok"] = _stamped(agent, effect_id)
    stripe_verifier.hold = threading.Event()
    try:
        response = _resolve(client_for(users["operator"]), agent, effect_id, {"stripe_id": "pi_ok"})
    finally:
        stripe_verifier.hold.set()  # let the abandoned check finish

    assert response.status_code == 409
    assert "stripe did not answer within 0.2 s" in html(response)
    assert agent.state(effect_id) == "unknown"


def test_the_htmx_answer_says_what_the_provider_said(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier
) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-h", amount=700)
    stripe_verifier.objects["pi_ok"] = _stamped(agent, effect_id)
    data = {"fence": agent.fence(effect_id), "confirm": "on", "receipt": '{"stripe_id": "pi_ok"}'}
    url = reverse("resolve-happened", args=[effect_id])
    response = post(client_for(users["operator"]), url, data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    page = html(response)
    assert "Asked before committing: stripe confirmed it: pi_ok exists" in page
    assert 'data-state="committed"' in page


def test_a_tool_without_a_verifier_is_not_checked_at_the_provider(
    agent: Agent, users, stripe_verifier: FakeStripeVerifier
) -> None:
    effect_id = agent.call("email.send", UNKNOWN, to="c@example.com")
    key = agent.oo.get(effect_id).provider_key
    client = client_for(users["operator"])
    assert "the console asks the provider" not in html(
        client.get(reverse("effect", args=[effect_id]))
    )
    response = _resolve(client, agent, effect_id, {"message_id": f"<{key}@mail.example>"})
    assert response.status_code == 302
    assert "provider_check" not in agent.journal(effect_id)[-2].evidence
    assert stripe_verifier.verified == []


# -- the real Stripe prober, against a Stripe-like server on a real socket -----------------


def test_the_stripe_prober_verifies_through_the_console(agent: Agent, users, settings: Any) -> None:
    from openonce_core.probers import RateLimiter, StripeProber, StripeRestClient
    from tests.support.fake_stripe import FakeStripeServer

    with FakeStripeServer(api_keys=(KEY,)) as stripe:
        client = StripeRestClient(KEY, base_url=stripe.url, limiter=RateLimiter("stripe", 1000.0))
        settings.OPENONCE_PROBERS = {"stripe.charge": StripeProber(client)}
        mine = agent.unknown("stripe.charge", order="o-real", amount=500)
        other = agent.unknown("stripe.charge", order="o-other", amount=500)
        theirs = stripe.add("payment_intents", agent.oo.get(other).provider_key)["id"]
        ours = stripe.add("payment_intents", agent.oo.get(mine).provider_key)["id"]
        operator = client_for(users["operator"])

        response = _resolve(operator, agent, mine, {"stripe_id": theirs})
        assert response.status_code == 409
        page = html(response)
        assert "stripe did not confirm this receipt" in page
        assert f"PaymentIntent {theirs} carries provider key" in page
        assert agent.state(mine) == "unknown"

        stripe.accept_keys("sk_live_another")  # the console's key is revoked
        response = _resolve(operator, agent, mine, {"stripe_id": ours})
        assert response.status_code == 409
        assert KEY not in html(response) and agent.state(mine) == "unknown"

        stripe.accept_keys(KEY)
        response = _resolve(operator, agent, mine, {"stripe_id": ours})
        assert response.status_code == 302
        assert agent.state(mine) == "committed"
        assert agent.journal(mine)[-2].evidence["provider_check"]["confirmed"] is True
