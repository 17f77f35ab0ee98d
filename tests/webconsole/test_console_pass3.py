"""The console's third pass (issue 21): the email receipt template names the real
sending domain and is accepted as given, and no page with notifications present scrolls
sideways on a 390 px phone (Chromium, under the deployment's Content-Security-Policy).
"""

from __future__ import annotations

import html as entities
import json
import re
from typing import Any

import pytest
from conftest import PHONE
from django.urls import reverse
from playwright.sync_api import Page
from test_console_views import (
    PASSWORD,
    UNKNOWN,
    Agent,
    client_for,
    decide,
    fresh_ledger,
    html,
    make_users,
)
from test_notifications import configure, webhook

from notifications import dispatch
from notifications.models import Delivery
from openonce_core.probers.email import EmailMessageIdProber
from tests.support.browser import screenshot, sign_in_with
from tests.support.fake_http import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)
DOMAIN = "mail.shop.example"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


# -- the email receipt template -----------------------------------------------------------


class SentStore:
    """A sender's sent store holding the messages it was given, by Message-ID."""

    def __init__(self) -> None:
        self.sent: set[str] = set()

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        return [{"message_id": message_id, "id": "s-1"}] if message_id in self.sent else []


@pytest.fixture
def sent_store(settings: Any, agent: Agent) -> SentStore:
    store = SentStore()
    # The reconciler wraps every registered prober (reconciler.probes.instrument).
    prober = EmailMessageIdProber(store, authoritative=True, domain=DOMAIN)
    settings.OPENONCE_PROBERS = {"email.send": prober}
    return store


def template_on_the_page(page: str) -> str:
    form = page[page.index('id="action-resolve-happened"') :]
    found = re.search(r'<textarea name="receipt"[^>]*>(.*?)</textarea>', form, re.S)
    assert found, "no receipt field in the resolve form"
    return entities.unescape(found.group(1)).strip()


def test_the_email_receipt_template_names_the_sending_domain_and_is_accepted_as_given(
    agent: Agent, users, sent_store: SentStore
) -> None:
    effect_id = agent.call("email.send", UNKNOWN, to="ann@example.com")
    key = agent.oo.get(effect_id).provider_key
    sent_store.sent.add(f"<{key}@{DOMAIN}>")
    client = client_for(users["operator"])

    page = html(client.get(reverse("effect", args=[effect_id])))
    template = template_on_the_page(page)
    assert json.loads(template)["message_id"] == f"<{key}@{DOMAIN}>"
    assert "your-sending-domain" not in page

    response = decide(
        client, "resolve-happened", effect_id, agent.fence(effect_id), receipt=template
    )
    assert response.status_code == 302, html(response)
    assert agent.state(effect_id) == "committed"
    assert agent.oo.get(effect_id).result["message_id"] == f"<{key}@{DOMAIN}>"


def test_the_template_of_a_message_the_store_does_not_hold_is_still_asked_and_refused(
    agent: Agent, users, sent_store: SentStore
) -> None:
    effect_id = agent.call("email.send", UNKNOWN, to="bob@example.com")
    client = client_for(users["operator"])
    template = template_on_the_page(html(client.get(reverse("effect", args=[effect_id]))))

    response = decide(
        client, "resolve-happened", effect_id, agent.fence(effect_id), receipt=template
    )
    assert response.status_code == 409  # refused: the provider has no such message
    assert "did not confirm this receipt" in html(response)
    assert "Replace your-sending-domain" not in html(response)
    assert agent.state(effect_id) == "unknown"


# -- phones -------------------------------------------------------------------------------


def sideways(page: Page) -> int:
    """How many pixels the page scrolls sideways."""
    return int(
        page.evaluate(
            "document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"
        )
    )


def notified(agent: Agent) -> tuple[str, str]:
    """A refund waiting for approval and a charge in human review, each announced to a
    webhook that refused it (so the page shows the channel, the error and the next try)."""
    receiver = WebhookReceiver()
    receiver.fail_next = 99
    try:
        with configure(webhook(receiver)):
            dispatch.tick()  # the notifier starts reading here
            refund = agent.pending(charge="ch_notified", amount=2500)
            review = agent.human_review(order="hr-notified")
            dispatch.tick()
    finally:
        receiver.close()
    assert Delivery.objects.filter(effect_id=refund, attempts=1).exists()
    assert Delivery.objects.filter(effect_id=review, attempts=1).exists()
    return refund, review


def test_no_page_with_notifications_scrolls_sideways_at_390px(
    open_page, agent: Agent, users
) -> None:
    refund, review = notified(agent)
    approver = client_for(users["approver"])  # the refund's page lists the approval too
    assert decide(approver, "approve", refund, agent.fence(refund)).status_code == 302

    page = open_page(PHONE)
    sign_in_with(page, "admin", PASSWORD)
    for url in (
        reverse("effect", args=[refund]),
        reverse("effect", args=[review]),
        "/",
        reverse("effects"),
        reverse("audit"),
    ):
        page.goto(url)
        assert sideways(page) <= 0, f"{url} scrolls {sideways(page)} px sideways at 390 px"
    # The notification is one labelled card per delivery, its error wrapped.
    page.goto(reverse("effect", args=[refund]))
    delivery = page.locator("#deliveries td[data-label=Detail]").first
    assert "500" in delivery.inner_text()
    assert screenshot(page, "pass3-notifications-phone.png").stat().st_size > 10_000
