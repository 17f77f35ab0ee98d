"""Malformed input never reaches a 500: every query parameter and form value the console
reads is fuzzed with the values that break naive parsers (superscript digits, huge and
negative integers, NaN and infinities, NUL bytes, non-UTF-8 percent-escapes, overlong
strings, direction controls, a 5,000-digit integer in a receipt). Each gets a 400 or a
form error, and nothing changed: the effect's state, fence and journal are as before.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from test_console_views import (
    CSRF,
    Agent,
    client_for,
    fresh_ledger,
    html,
    make_users,
    post,
)

pytestmark = pytest.mark.django_db(transaction=True)

NASTY = [
    "²",
    "9" * 400,
    "-1",
    "-9" * 30,
    "NaN",
    "nan",
    "inf",
    "-inf",
    "1e309",
    "0x10",
    "\x00",
    "a\x00b",
    "x" * 10_000,
    "\u202e1",
    "1~",
    "~eff_1",
    "1.5~",
    "nan~eff_1",
    "1e400~eff_1",
    "-5~eff_1",
    "   ",
    "%",
]

# Parameters whose every malformed value must be refused with a 400 (not ignored).
MUST_REFUSE = {
    "queue": {"since": ["²", "9" * 400, "-1", "NaN", "inf", "1e309", "\x00", "x" * 10_000]},
    "effects": {
        "after": ["²", "1~", "~eff_1", "nan~eff_1", "1e400~eff_1", "-5~eff_1", "\x00"],
        "before": ["²", "nan~eff_1", "-5~eff_1", "x" * 10_000],
        "created_from": ["²", "9" * 400, "NaN", "\x00", "2026-13-40T99:99"],
        "stuck": ["²", "9" * 400, "NaN", "inf", "1e309", "-1", "\x00"],
        "state": ["²", "\x00", "x" * 10_000],
        "q": ["\x00", "x" * 10_000],
        "tool": ["\x00", "x" * 10_000],
        "key": ["\x00", "x" * 10_000],
    },
    "audit": {
        "before": ["²", "9" * 400, "-1", "NaN", "\x00", "0"],
        "after": ["²", "9" * 400, "-1", "1.5"],
        "since": ["²", "NaN", "\x00"],
        "action": ["²", "approve\x00"],
        "actor": ["\x00", "x" * 10_000],
    },
}


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def snapshot(agent: Agent, effect_id: str) -> tuple[Any, ...]:
    effect = agent.oo.get(effect_id)
    return (effect.state, effect.fence, effect.result, len(agent.journal(effect_id)))


@pytest.mark.parametrize("page", ["queue", "effects", "audit", "audit-csv", "audit-json"])
def test_every_query_parameter_gets_a_200_or_a_400(agent: Agent, users, page: str) -> None:
    agent.pending()
    client = client_for(users["admin"])
    names = {
        "queue": ["kind", "since"],
        "effects": [
            "q",
            "state",
            "tool",
            "scope",
            "key",
            "created_from",
            "created_to",
            "stuck",
            "after",
            "before",
        ],
    }.get(page, ["actor", "action", "tool", "since", "until", "before", "after"])
    for name in names:
        for value in NASTY:
            response = client.get(reverse(page), {name: value})
            assert response.status_code in (200, 400), (page, name, value)
        for value in MUST_REFUSE.get(page, {}).get(name, []):
            response = client.get(reverse(page), {name: value})
            assert response.status_code == 400, (page, name, value)


@pytest.mark.parametrize("page", ["queue", "effects", "audit"])
def test_non_utf8_percent_escapes_are_not_a_500(agent: Agent, users, page: str) -> None:
    client = client_for(users["admin"])
    for query in ("before=%ff", "since=%c3%28", "q=%ff%fe", "after=%80~eff", "x=%"):
        response = client.get(reverse(page), QUERY_STRING=query)
        assert response.status_code in (200, 400), (page, query)


def test_pasting_a_cursor_into_both_directions_is_refused(agent: Agent, users) -> None:
    response = client_for(users["viewer"]).get(
        reverse("effects"), {"after": "1.0~eff_a", "before": "2.0~eff_b"}
    )
    assert response.status_code == 400
    assert "That page link is malformed" in html(response)


RECEIPTS = [
    "{" + '"stripe_id": ' + "9" * 5000 + "}",  # Python refuses to convert it
    '{"stripe_id": NaN}',
    '{"stripe_id": Infinity}',
    '{"stripe_id": -Infinity}',
    "[" * 5000 + "]" * 5000,
    '{"a": ' * 2000 + "1" + "}" * 2000,
    "null",
    '"a string"',
    "{}",
    "\x00",
    '{"stripe_id": "\x00"}',
    "x" * 25_000,
    '{"stripe_id": ""}',
    '{"stripe_id": null}',
    '{"stripe_id": "pi_1", "message_id": "<oo_x@your-sending-domain>"}',  # the placeholder
]


def test_a_malformed_receipt_is_a_form_error_and_changes_nothing(agent: Agent, users) -> None:
    effect_id = agent.unknown("stripe.charge")
    client = client_for(users["admin"])
    before = snapshot(agent, effect_id)
    url = reverse("resolve-happened", args=[effect_id])
    for receipt in RECEIPTS:
        data = {"fence": agent.fence(effect_id), "confirm": "on", "receipt": receipt}
        response = post(client, url, data)
        assert response.status_code in (400, 409), receipt[:40]
        assert 'class="error' in html(response) or "errorlist" in html(response)
        assert snapshot(agent, effect_id) == before, receipt[:40]


@pytest.mark.parametrize(
    ("action", "effect_kind"),
    [
        ("approve", "pending"),
        ("deny", "pending"),
        ("cancel", "pending"),
        ("resolve-happened", "unknown"),
        ("resolve-not-happened", "unknown"),
    ],
)
def test_malformed_decision_fields_are_form_errors_and_change_nothing(
    agent: Agent, users, action: str, effect_kind: str
) -> None:
    effect_id = agent.pending() if effect_kind == "pending" else agent.unknown("stripe.charge")
    client = client_for(users["admin"])
    before = snapshot(agent, effect_id)
    good = {
        "fence": str(agent.fence(effect_id)),
        "confirm": "on",
        "reason": "checked",
        "receipt": '{"stripe_id": "pi_1"}',
    }
    url = reverse(action, args=[effect_id])
    fields = ["fence", "reason"] + (["receipt"] if action == "resolve-happened" else [])
    for field in fields:
        for value in [*NASTY, "99999999999999999999999"]:
            if field == "reason" and "\x00" not in value and len(value) <= 2000:
                continue  # an odd reason ("NaN", "²", digits) is still a reason
            data = {**good, field: value}
            response = post(client, url, data)
            assert response.status_code in (400, 409), (action, field, value[:30])
            assert snapshot(agent, effect_id) == before, (action, field, value[:30])


def test_a_forged_bulk_token_and_preview_are_refused(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["admin"])
    before = snapshot(agent, effect_id)
    for token in ("", "x" * 200_000, "\x00", "eyJ9:garbage", "²"):
        response = post(
            client, reverse("bulk-apply"), {"token": token, "confirm": "on", "reason": "r"}
        )
        assert response.status_code == 400, token[:20]
    for value in NASTY:
        response = client.get(reverse("bulk"), {"action": value})
        assert response.status_code == 400
        response = client.get(reverse("bulk"), {"action": "cancel", "stuck": value})
        assert response.status_code in (200, 400)
    assert snapshot(agent, effect_id) == before


def test_an_effect_id_that_names_nothing_is_a_404_whatever_it_holds(agent: Agent, users) -> None:
    client = client_for(users["viewer"])
    for effect_id in ("eff_nope", "x" * 5000, "²", "%00", "..%2f..", "\u202e", "a%00b"):
        assert client.get(f"/effects/{effect_id}/").status_code == 404
    assert CSRF  # the client set the CSRF cookie, so POSTs above were not refused by it


def test_templates_hold_nothing_the_content_security_policy_would_block() -> None:
    """script-src 'self' and style-src 'self' without 'unsafe-inline': no inline script,
    no style attribute or element, no inline handler, no htmx feature that evaluates."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "templates"
    offences = []
    for template in root.rglob("*.html"):
        text = re.sub(r"\{#.*?#\}", "", template.read_text())  # comments are not sent
        for pattern, what in [
            (r"<script(?![^>]*\bsrc=)[^>]*>", "inline <script>"),
            (r"<style\b", "<style> element"),
            (r"\sstyle=", "style attribute"),
            (r"\son[a-z]+=", "inline event handler"),
            (r"hx-on", "hx-on (evaluated)"),
            (r"js:", "js: expression"),
            (r"hx-vals=['\"]js", "evaluated hx-vals"),
            (r'hx-trigger="[^"]*\[', "hx-trigger filter (evaluated)"),
        ]:
            if re.search(pattern, text):
                offences.append(f"{template.relative_to(root)}: {what}")
    assert offences == []
    base = (root / "base.html").read_text()
    assert '"includeIndicatorStyles": false' in base and '"allowEval": false' in base
