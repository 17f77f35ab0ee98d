"""Round 3 review (R2): malformed values found by an adversarial pass answer 4xx, never
500, and change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from test_console_views import Agent, client_for, fresh_ledger, make_users

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


@pytest.mark.parametrize(
    "q",
    [
        "arg:x=a\x00b",
        "tool:a\x00b",
        "key:a\x00b",
        "scope:a\x00b",
        "id:eff_\x00",
        "free\x00text",
        "x=a\x00",
        'arg:x="a\\u0000"',
    ],
)
def test_a_raw_nul_anywhere_in_a_search_is_a_400(agent: Agent, users, q: str) -> None:
    agent.call("stripe.refund", charge="ch_1", amount=700)
    client = client_for(users["viewer"])
    client.raise_request_exception = False
    response = client.get(reverse("effects"), {"q": q})
    assert response.status_code == 400, (q, response.status_code)


# -- a trusted proxy that writes the client's port ----------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "client"),
    [
        ("203.0.113.5:51000", "203.0.113.5:51001", "203.0.113.5"),
        ("[2001:db8::5]:51000", "[2001:db8::5]:51001", "2001:db8::5"),
    ],
)
def test_a_forwarded_address_with_a_port_counts_as_the_address(
    settings, rf, first: str, second: str, client: str
) -> None:
    """Some proxies append "address:port"; each connection has its own port, so counted
    with it every sign-in guess would come from a fresh address."""
    from ledger.net import forwarded_client

    settings.OPENONCE_BEHIND_PROXY = True
    seen = {
        forwarded_client(rf.get("/", HTTP_X_FORWARDED_FOR=entry, REMOTE_ADDR="127.0.0.1"))
        for entry in (first, second)
    }
    assert seen == {client}
