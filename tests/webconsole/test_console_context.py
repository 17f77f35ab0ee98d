"""What a person reads before deciding: agent data made visible (no hidden or reordering
characters), secrets by role, amounts with their currency, who asked, the probe's
verdict in words, the state's meaning, receipt templates per capability, and the search
box's reading of a query. The page tests render every page that shows agent data.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.urls import reverse
from test_console_views import UNKNOWN, Agent, client_for, decide, fresh_ledger, html, make_users

from console import context, search
from console.templatetags.console_tags import args_summary, pretty_json, secret, visible
from openonce_core._providers import BUILTIN_CAPABILITIES

HIDDEN = ["\u202e", "\u202a", "\u2066", "\u2069", "\u200b", "\u200f", "\ufeff", "\x07", "\x85"]


def caps(tool: str) -> list[Any]:
    return [c for c in BUILTIN_CAPABILITIES if c.matches(tool)]


# -- the one filter for agent data --------------------------------------------------------


@pytest.mark.parametrize("char", HIDDEN)
def test_hidden_characters_are_shown_as_what_they_are(char: str) -> None:
    shown = str(visible(f"DE89{char}3704"))
    assert char not in shown
    assert f"U+{ord(char):04X}" in shown and 'class="hidden-char"' in shown
    assert shown.startswith("DE89") and shown.endswith("3704")


def test_a_reversed_iban_reads_as_a_warning_not_as_text() -> None:
    # U+202E RIGHT-TO-LEFT OVERRIDE would make the browser print the digits backwards.
    shown = str(visible("IBAN DE89 3704 \u202e0044 0532 0130 00"))
    assert "\u202e" not in shown
    assert "RIGHT-TO-LEFT OVERRIDE" in shown  # named on hover


def test_a_page_title_gets_the_marker_as_text() -> None:
    from console.templatetags.console_tags import visible_plain

    assert visible_plain("wire\u202e.transfer") == "wire[U+202E].transfer"


def test_visible_escapes_html_and_keeps_plain_text_plain() -> None:
    assert str(visible("<b>refund</b> & more\nline two\tok")) == (
        "&lt;b&gt;refund&lt;/b&gt; &amp; more\nline two\tok"
    )
    assert str(visible(None)) == ""


def test_json_and_summaries_go_through_the_same_filter() -> None:
    class E:
        args = {"to": "ops\u202e@example.com", "card": "sha256:" + "a" * 64}

    assert "\u202e" not in str(pretty_json(E.args)) and "U+202E" in str(pretty_json(E.args))
    assert "U+202E" in str(args_summary(E()))
    # Secrets: a viewer sees the word, an operator a short prefix, nobody the digest.
    assert "card=secret" in str(args_summary(E()))
    assert "secret · sha256:aaaaaaaa…" in str(args_summary(E(), True))
    assert "a" * 64 not in str(pretty_json(E.args, True)) + str(args_summary(E(), True))
    assert secret("hmac-sha256:" + "b" * 64) == "secret"


# -- decision context ---------------------------------------------------------------------


def test_amounts_carry_their_currency_or_say_it_is_missing() -> None:
    assert [f.value for f in context.amounts({"amount_cents": 2500, "currency": "usd"})] == [
        "25.00 USD"
    ]
    assert [f.value for f in context.amounts({"amount": 2500, "currency": "JPY"})] == ["2,500 JPY"]
    assert [f.value for f in context.amounts({"amount": 12345, "currency": "KWD"})] == [
        "12.345 KWD"
    ]
    assert [f.value for f in context.amounts({"amount_cents": -150, "currency": "EUR"})] == [
        "-1.50 EUR"
    ]
    assert [f.value for f in context.amounts({"amount_cents": 2500})] == [
        "2,500 minor units (no currency argument)"
    ]
    assert context.amounts({"amount": True, "n": 3}) == []  # a flag is not an amount


def test_the_requester_comes_from_the_first_journal_line() -> None:
    who = context.requester("agent:worker-7.example:4242", "run-9")
    assert who is not None
    assert (who.host, who.pid, who.run) == ("worker-7.example", "4242", "run-9")
    assert str(who) == "worker-7.example pid 4242, run run-9"
    # The core's owner name also tells processes with one pid apart; readers need host, pid.
    core = context.requester("agent:vm:27246:4026531836.1038555", None)
    assert core is not None
    assert (core.agent, core.host, core.pid) == ("vm:27246", "vm", "27246")
    named = context.requester("agent:support-bot", None)
    assert named is not None and str(named) == "support-bot"
    assert context.requester("operator:eric", None) is None


def test_the_probe_verdict_is_said_in_words() -> None:
    evidence = {
        "observations": [
            {"outcome": "happened", "detail": "old", "at": 1.0},
            {"outcome": "inconclusive", "detail": "sent-store search failed", "at": 2.0},
        ]
    }
    verdict = context.probe_verdict(evidence)
    assert verdict is not None
    assert verdict.words == "the probe could not tell: sent-store search failed"
    assert verdict.at == 2.0
    assert context.probe_verdict({"resolution": "happened"}) is None


def test_every_state_says_what_it_means_and_what_happens_next() -> None:
    from openonce_core._states import EffectState

    for state in EffectState:
        meaning, next_step = context.STATE_MEANINGS[state]
        assert meaning and next_step
    assert "nothing has run yet" in context.STATE_MEANINGS["approved"][0]
    assert "when the agent makes the same call again" in context.STATE_MEANINGS["approved"][1]


def test_receipt_templates_are_per_capability_and_prefilled() -> None:
    email = context.receipt_template(
        caps("email.send"), provider_key="oo_abc", args={}, mail_domain="mail.example"
    )
    assert json.loads(email.text) == {"message_id": "<oo_abc@mail.example>"}
    assert "stripe" not in email.text
    stripe = context.receipt_template(caps("stripe.charge"), provider_key="oo_k", args={})
    assert json.loads(stripe.text) == {"stripe_id": ""}  # only Stripe can tell the id
    assert "oo_k" not in stripe.text and "provider key" in stripe.explain
    pr = context.receipt_template(
        caps("github.create_pr"),
        provider_key="oo_p",
        args={"owner": "acme", "repo": "api", "head": "fix-login"},
    )
    assert json.loads(pr.text) == {
        "number": None,
        "head": "fix-login",
        "owner": "acme",
        "repo": "api",
    }
    unknown = context.receipt_template([], provider_key="oo_u", args={})
    assert json.loads(unknown.text) == {"provider_reference": ""}


# -- the search box's reading -------------------------------------------------------------


def test_the_search_box_reads_what_is_pasted_into_it() -> None:
    assert search.parse("  ") is None
    assert search.parse("eff_3f2a") == search.Search("id", "eff_3f2a")
    assert search.parse("stripe.*") == search.Search("tool", "stripe.*")
    got = search.parse("charge=ch_1 amount=2500 live=true")
    assert got is not None and got.kind == "arg"
    assert got.args == {"charge": "ch_1", "amount": 2500, "live": True}
    nested = search.parse("arg:customer.id=cus_9")
    assert nested is not None and nested.args == {"customer": {"id": "cus_9"}}
    assert search.parse("run-2026") == search.Search("any", "run-2026")
    assert search.parse("key:refund-ch") == search.Search("key", "refund-ch")
    quoted = search.parse('order="42"')
    assert quoted is not None and quoted.args == {"order": "42"}  # a string, not 42


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("x" * 501, "at most 500"),
        ("a\x00b", "control characters"),
        ('order="42', "close the quotes"),
        ("a=1 a=2", "searched twice"),
        (" ".join(f"k{i}=1" for i in range(9)), "at most 8"),
        ("a=1 a.b=2", "searched as a value"),
    ],
)
def test_a_query_that_cannot_be_read_says_why(query: str, problem: str) -> None:
    with pytest.raises(search.SearchError, match=problem):
        search.parse(query)


# -- on the pages -------------------------------------------------------------------------


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


@pytest.mark.django_db(transaction=True)
def test_no_page_shows_a_hidden_character_of_agent_data_or_a_reason(agent: Agent, users) -> None:
    sneaky = "DE89\u202e0044\u200b"
    refund = agent.pending(charge=sneaky, amount=500)
    unknown = agent.call("ledger.sync", UNKNOWN, account=sneaky)
    admin = client_for(users["admin"])
    response = decide(admin, "deny", refund, agent.fence(refund), reason=f"customer said {sneaky}")
    assert response.status_code == 302
    with agent.oo.scope(f"run{sneaky}"):
        agent.call("ledger.sync", {"ok": True}, account="x")

    pages = [
        reverse("queue"),
        reverse("effects"),
        reverse("effects") + "?q=account%3D" + "DE89%E2%80%AE0044%E2%80%8B",
        reverse("effect", args=[refund]),
        reverse("effect", args=[unknown]),
        reverse("audit"),
    ]
    for url in pages:
        response = admin.get(url)
        assert response.status_code == 200, url
        # Not displayed, so left exact: the search box's echo of what the person typed,
        # and what a copy button copies (the value itself, for pasting elsewhere).
        page = re.sub(r'(value|data-copy)="[^"]*"', "", html(response))
        for char in ("\u202e", "\u200b"):
            assert char not in page, f"{url} shows U+{ord(char):04X} raw"
    assert "U+202E" in html(admin.get(reverse("effect", args=[refund])))
    assert "U+202E" in html(admin.get(reverse("audit")))  # the reason, made visible


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_secret_not_the_digest_an_operator_a_prefix(agent: Agent, users) -> None:
    effect_id = agent.call(
        "stripe.charge", UNKNOWN, secret_fields=("card",), order="o-s", card="4242424242424242"
    )
    digest = agent.oo.get(effect_id).args["card"]
    scheme, hexdigits = digest.split(":")
    for who, expect, refuse in [
        ("viewer", "secret", f"{scheme}:{hexdigits[:8]}"),
        ("operator", f"secret · {scheme}:{hexdigits[:8]}…", hexdigits),
    ]:
        client = client_for(users[who])
        for url in (reverse("effect", args=[effect_id]), reverse("effects")):
            page = html(client.get(url))
            assert expect in page, (who, url)
            assert refuse not in page, (who, url)
            assert "4242424242424242" not in page


@pytest.mark.django_db(transaction=True)
def test_the_detail_page_gives_the_decision_context_first(agent: Agent, users) -> None:
    effect_id = agent.call("stripe.refund", charge_id="pi_7", amount_cents=2500, currency="usd")
    page = html(client_for(users["approver"]).get(reverse("effect", args=[effect_id])))

    assert "25.00 USD" in page
    assert "Waiting for approval. Nothing has been sent to the provider." in page
    assert "it runs when the agent calls again" in page
    actor = agent.journal(effect_id)[0].actor.removeprefix("agent:")
    assert actor in page  # requested by the agent process
    # Arguments come before the decision forms; only legal decisions are offered.
    assert page.index("Arguments") < page.index('id="action-approve"')
    assert 'id="action-resolve-happened"' not in page
    # Times are UTC, labelled, as the filters read them; no script rewrites them.
    assert '<span class="utc">' in page and " UTC</span>" in page and "<time datetime" not in page


@pytest.mark.django_db(transaction=True)
def test_after_approval_the_page_says_nothing_ran_and_the_queue_still_shows_it(
    agent: Agent, users
) -> None:
    effect_id = agent.pending(charge="ch_ok", amount=900)
    approver = client_for(users["approver"])
    assert decide(approver, "approve", effect_id, agent.fence(effect_id)).status_code == 302

    page = html(approver.get(reverse("effect", args=[effect_id])))
    assert "Approved: nothing has run yet." in page
    assert "It runs when the agent makes the same call again." in page
    assert "Withdraw the approval (deny)" in page  # the core still accepts a deny
    assert 'id="action-approve"' not in page  # approving again is not legal
    assert 'id="action-resolve-happened"' not in page
    queue = html(approver.get(reverse("queue"), {"kind": "approved"}))
    assert effect_id in queue and "Approved, waiting for the agent" in queue
    assert effect_id not in html(approver.get(reverse("queue")))  # nobody has to act


@pytest.mark.django_db(transaction=True)
def test_a_rearm_that_would_be_refused_is_not_offered(agent: Agent, users) -> None:
    effect_id = agent.call(
        "email.send", UNKNOWN, to="ann@example.com"
    )  # SMTP: a miss is no evidence
    page = html(client_for(users["operator"]).get(reverse("effect", args=[effect_id])))
    assert 'id="action-resolve-not-happened"' not in page
    assert "not offered, because a miss is not evidence for this provider" in page
    page = html(client_for(users["admin"]).get(reverse("effect", args=[effect_id])))
    assert 'id="action-resolve-not-happened"' in page  # the override permission


@pytest.mark.django_db(transaction=True)
def test_the_page_and_the_queue_name_who_the_agent_asked_for(agent: Agent, users) -> None:
    with agent.oo.requested_by("mcp:claude-code#sess-4"):
        effect_id = agent.pending(charge="ch_for", amount=700)
    viewer = client_for(users["viewer"])
    page = html(viewer.get(reverse("effect", args=[effect_id])))
    assert "mcp:claude-code#sess-4</code> through the agent on host" in page
    queue = html(viewer.get(reverse("queue")))
    assert "mcp:claude-code#sess-4 via " in queue
