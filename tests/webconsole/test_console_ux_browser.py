"""The console as operators prefer it, in Debian's Chromium at 1280 px and 390 px, every
response served under the deployment's Content-Security-Policy (a violation fails the
test): live updates that never move focus or a selection, a receipt naming another
effect refused inline and accepted only with the override and a reason, one search box,
no sideways scrolling on a phone, the keyboard, local times, dark mode, and axe-core
(current, experimental rules on) finding no serious or critical violation on any page.

Screenshots of the queue, a detail page and a search at both widths go to
artifacts/screenshots/ (gitignored).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from conftest import DESKTOP, PHONE
from django.urls import reverse
from playwright.sync_api import Page, expect
from test_console_views import PASSWORD, UNKNOWN, Agent, fresh_ledger, make_users

from tests.support.browser import screenshot, sign_in_with

pytestmark = pytest.mark.django_db(transaction=True)
CONFIRM = "I have checked this effect and confirm the decision"
LONG_MESSAGE_ID = "<" + "a-very-long-message-identifier-without-spaces-" * 3 + "@mail.example.com>"


@pytest.fixture
def agent(transactional_db: None) -> Any:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> Any:
    return make_users()


def sign_in(page: Page, username: str) -> None:
    sign_in_with(page, username, PASSWORD)


# -- live updates -------------------------------------------------------------------------


def test_focus_and_a_selection_survive_three_refreshes(open_page, agent: Agent, users) -> None:
    first = agent.pending(charge="ch_focus", amount=100)
    second = agent.pending(charge="ch_select", amount=200)
    page = open_page()
    sign_in(page, "approver")
    page.goto("/")
    expect(page).to_have_title(re.compile(r"^\(2\) Human queue"))

    page.keyboard.press("j")  # the first row's link takes the focus
    focused = reverse("effect", args=[first])
    expect(page.locator(":focus")).to_have_attribute("href", focused)
    # Select the second row's argument summary, as someone about to copy it would.
    selected = page.evaluate(
        """(id) => {
            const cell = document.querySelector(`#row-${id} .args`);
            const range = document.createRange();
            range.selectNodeContents(cell);
            const sel = window.getSelection();
            sel.removeAllRanges();
            sel.addRange(range);
            return sel.toString();
        }""",
        second,
    )
    assert "ch_select" in selected

    for n in range(3):
        newcomer = agent.pending(charge=f"ch_new_{n}", amount=300 + n)
        # The table refreshes on its own every 5 s: wait for the new row, deadline-bound.
        row = page.locator(f"#row-{newcomer}")
        expect(row).to_be_visible(timeout=15_000)
        expect(row).to_have_class(re.compile(r"\bnew\b"))
        expect(row).to_contain_text("new")
        # The title follows after the swap settles: only then is the refresh over.
        expect(page).to_have_title(re.compile(rf"^\({3 + n}\) Human queue"))
        assert page.evaluate("document.activeElement.getAttribute('href')") == focused
        assert page.evaluate("window.getSelection().toString()") == selected
    expect(page.locator("#queue-rows tr[data-row]")).to_have_count(5)
    # The rows that were there before stay unmarked.
    assert "new" not in (page.locator(f"#row-{first}").get_attribute("class") or "")


# -- receipts -----------------------------------------------------------------------------


def test_a_receipt_naming_another_message_is_refused_then_overridden_with_a_reason(
    open_page, agent: Agent, users
) -> None:
    effect_id = agent.call("email.send", UNKNOWN, to="ann@example.com")
    key = agent.oo.get(effect_id).provider_key
    page = open_page()
    sign_in(page, "operator")
    page.goto(reverse("effect", args=[effect_id]))

    form = page.locator("#action-resolve-happened")
    receipt = form.locator("textarea[name=receipt]")
    # Pre-filled with this effect's own Message-ID, not a Stripe example.
    assert json.loads(receipt.input_value())["message_id"].startswith(f"<{key}@")
    assert "stripe" not in page.locator(".receipt-help").inner_text().lower()
    receipt.fill('{"message_id": "<someone-else@mail.example.com>"}')
    form.get_by_label(CONFIRM).check()
    form.get_by_role("button", name="Resolve: it happened").click()

    error = page.locator("#action-resolve-happened .errorlist")
    expect(error).to_contain_text("This receipt names another effect")
    expect(error).to_contain_text("someone-else")
    assert (
        page.locator("#action-resolve-happened")
        .get_by_label("Override: commit although the receipt names another identity")
        .count()
        == 0
    )  # an operator does not hold the override permission
    assert agent.state(effect_id) == "unknown"
    lines = len(agent.journal(effect_id))

    page = open_page()
    sign_in(page, "admin")
    page.goto(reverse("effect", args=[effect_id]))
    form = page.locator("#action-resolve-happened")
    form.locator("textarea[name=receipt]").fill('{"message_id": "<relayed-1@mail.example.com>"}')
    form.get_by_label("Override: commit although the receipt names another identity").check()
    form.get_by_label(CONFIRM).check()
    form.get_by_role("button", name="Resolve: it happened").click()
    expect(page.locator("#action-resolve-happened")).to_contain_text("An override needs a reason")
    assert agent.state(effect_id) == "unknown" and len(agent.journal(effect_id)) == lines

    form = page.locator("#action-resolve-happened")
    form.get_by_label("Reason").fill("the relay rewrote the Message-ID; matched by subject")
    form.get_by_label(CONFIRM).check()
    form.get_by_role("button", name="Resolve: it happened").click()
    expect(page.locator("#effect > header .state")).to_have_text("committed")
    timeline = page.locator("ol.timeline li.overridden")
    expect(timeline).to_contain_text("override by operator:admin")
    expect(timeline).to_contain_text("relayed-1")
    assert agent.state(effect_id) == "committed"


def test_copy_buttons_copy_the_ids(open_page, agent: Agent, users) -> None:
    effect_id = agent.unknown("stripe.charge", order="o-copy", amount=5)
    page = open_page()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    sign_in(page, "operator")
    page.goto(reverse("effect", args=[effect_id]))
    button = page.locator("#effect .crumbs button.copy")
    # What it says is its name (axe's label-content-name-mismatch): no other aria-label.
    expect(button).to_have_text("Copy effect id")
    expect(button).to_have_accessible_name("Copy effect id")
    button.click()
    expect(button).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == effect_id


# -- search -------------------------------------------------------------------------------


def test_the_search_box_finds_by_id_prefix_tool_glob_and_argument(
    open_page, agent: Agent, users
) -> None:
    refund = agent.pending(charge="ch_findme", amount=4200)
    email = agent.call("email.send", {"message_id": "<m@x>"}, to="bob@example.com")
    page = open_page()
    sign_in(page, "viewer")
    page.goto("/")

    def search(text: str) -> str:
        page.keyboard.press("/")  # the key focuses the search box
        page.keyboard.type(text)
        with page.expect_navigation():
            page.keyboard.press("Enter")
        return page.locator("#effect-results").inner_text()

    shown = {refund: refund[:15], email: email[:15]}  # the list shortens ids to 16 with "…"
    results = search(refund[:10])
    assert shown[refund] in results and shown[email] not in results
    results = search("email.*")
    assert shown[email] in results and shown[refund] not in results
    results = search("charge=ch_findme")
    assert shown[refund] in results and shown[email] not in results
    expect(page.locator(".result-count")).to_contain_text("1 effect matches")
    page.locator("#effect-results a[data-row-link]").first.click()
    expect(page.locator("#effect h1")).to_contain_text("stripe.refund")


# -- phones -------------------------------------------------------------------------------


def overflow(page: Page) -> int:
    """How far the page is wider than the window, measured in the page."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def test_no_page_scrolls_sideways_at_390px(open_page, agent: Agent, users) -> None:
    pending = agent.pending(charge="ch_" + "x" * 60, amount=2500)
    email = agent.call("email.send", UNKNOWN, to="ann@example.com", message_id=LONG_MESSAGE_ID)
    for n in range(3):
        agent.unknown("ledger.sync", order=f"order-{'y' * 40}-{n}")
    page = open_page(PHONE)
    sign_in(page, "admin")
    for url in (
        "/",
        reverse("effects"),
        reverse("effects") + "?q=stripe.*",
        reverse("effect", args=[pending]),
        reverse("effect", args=[email]),
        reverse("audit"),
        reverse("capabilities"),
        reverse("reconciler"),
    ):
        page.goto(url)
        assert overflow(page) <= 0, f"{url} is {overflow(page)} px too wide at 390 px"
        header = page.locator("header.top").bounding_box()
        assert header is not None and header["height"] <= 120, url
        # Tap targets: buttons and row links at least 24 px high (WCAG 2.2 target size).
        small = page.evaluate(
            """() => [...document.querySelectorAll(
                    'main button, a[data-row-link], .top a, .top button')]
                .filter(e => e.offsetParent !== null)
                .map(e => [e.textContent.trim(), e.getBoundingClientRect().height])
                .filter(([, h]) => h < 24)"""
        )
        assert small == [], (url, small)
    # A long Message-ID wraps instead of widening the page, and words do not break.
    page.goto(reverse("effect", args=[email]))
    assert overflow(page) <= 0


# -- keyboard -----------------------------------------------------------------------------


def test_keyboard_first_skip_link_rows_enter_and_help(open_page, agent: Agent, users) -> None:
    first = agent.pending(charge="ch_k1", amount=1)
    second = agent.pending(charge="ch_k2", amount=2)
    page = open_page()
    sign_in(page, "approver")
    page.goto("/")

    page.keyboard.press("Tab")
    skip = page.locator("a.skip")
    expect(skip).to_be_focused()
    expect(skip).to_have_text("Skip to the queue")
    page.keyboard.press("Enter")
    # The jump is a navigation to the fragment: Tab from where it landed, not before.
    expect(page).to_have_url(re.compile(r"#queue-rows$"))
    page.keyboard.press("Tab")  # the first row, two key presses after the page loads
    focused = page.locator(":focus")
    expect(focused).to_have_attribute("href", reverse("effect", args=[first]))
    # The focus ring is visible.
    expect(focused).not_to_have_css("outline-style", "none")
    page.keyboard.press("j")
    expect(focused).to_have_attribute("href", reverse("effect", args=[second]))
    page.keyboard.press("k")
    expect(focused).to_have_attribute("href", reverse("effect", args=[first]))
    page.keyboard.press("Enter")
    expect(page.locator("#effect h1")).to_contain_text("stripe.refund")
    # The page's scripts are loaded (readyState "complete"). Not wait_for_function: its
    # predicate can be evaluated with eval in the page, which the console's CSP refuses
    # (an EvalError, once in CI).
    page.wait_for_load_state("load")

    page.keyboard.press("?")
    expect(page.locator("#keys-help")).to_be_visible()
    expect(page.locator("#keys-help")).to_contain_text("next / previous row")
    page.keyboard.press("Escape")
    expect(page.locator("#keys-help")).to_be_hidden()


# -- times, dark mode, favicon ------------------------------------------------------------


def test_times_are_utc_in_every_zone(open_page, agent: Agent, users) -> None:
    effect_id = agent.pending()
    page = open_page(timezone="Asia/Tokyo")
    sign_in(page, "viewer")
    page.goto(reverse("effect", args=[effect_id]))
    created = page.locator("#context-title ~ dl .utc").first.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", created)


def test_dark_mode_follows_the_system_and_a_favicon_is_served(
    open_page, agent: Agent, users
) -> None:
    agent.pending()
    page = open_page(dark=True)
    sign_in(page, "viewer")
    page.goto("/")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(15, 20, 25)"
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert icon and page.request.get(icon).status == 200


# -- accessibility ------------------------------------------------------------------------


def serious_violations(page: Page, axe_source: str) -> list[str]:
    """axe-core's serious and critical violations on the page, its experimental rules
    enabled too (label-content-name-mismatch was one until 4.11)."""
    # Evaluated through the browser's debugging protocol, which the page's CSP does not
    # govern: nothing inline is added to the page.
    page.evaluate(axe_source)
    found = page.evaluate(
        """async () => {
            const experimental = Object.fromEntries(
                axe.getRules(['experimental']).map(rule => [rule.ruleId, {enabled: true}]));
            const result = await axe.run(
                document, {resultTypes: ['violations'], rules: experimental});
            return result.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => `${v.id} (${v.impact}): `
                    + v.nodes.slice(0, 3).map(n => n.target.join(' ')).join(', '));
        }"""
    )
    return list(found)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_axe_finds_no_serious_violation_on_any_page(
    open_page, agent: Agent, users, axe_source: str, viewport: dict[str, int], dark: bool
) -> None:
    from test_console_pass3 import notified
    from test_console_views import client_for, decide

    notified_refund, review = notified(agent)  # each with a failed notification
    pending = agent.pending(charge="ch_axe", amount=2500)
    unknown = agent.unknown("stripe.charge", order="o-axe", amount=700)
    email = agent.call("email.send", UNKNOWN, to="ann@example.com")
    approved = agent.pending(charge="ch_axe_ok", amount=300)
    response = decide(client_for(users["approver"]), "approve", approved, agent.fence(approved))
    assert response.status_code == 302
    page = open_page(viewport, dark=dark)
    sign_in(page, "admin")
    for url in (
        "/",
        reverse("effects"),
        reverse("effects") + "?q=stripe.*",
        reverse("effect", args=[pending]),
        reverse("effect", args=[unknown]),
        reverse("effect", args=[email]),
        reverse("effect", args=[approved]),
        reverse("effect", args=[notified_refund]),
        reverse("effect", args=[review]),
        reverse("bulk") + "?q=stripe.charge",
        reverse("audit"),
        reverse("capabilities"),
        reverse("reconciler"),
        reverse("lockouts"),
    ):
        page.goto(url)
        assert serious_violations(page, axe_source) == [], url


# -- screenshots --------------------------------------------------------------------------


def test_screenshots_of_queue_detail_and_search_at_both_widths(
    open_page, agent: Agent, users
) -> None:
    refund = agent.call("stripe.refund", charge_id="pi_demo1", amount_cents=2500, currency="usd")
    email = agent.call("email.send", UNKNOWN, to="ann@example.com", subject="Your refund")
    agent.human_review(order="hr-shot")
    agent.unknown("ledger.sync", order="o-shot")
    for name, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        for dark in (False, True):
            page = open_page(viewport, dark=dark)
            sign_in(page, "admin")
            suffix = f"{name}{'-dark' if dark else ''}.png"
            page.goto("/")
            assert screenshot(page, f"ux-queue-{suffix}").stat().st_size > 10_000
            page.goto(reverse("effect", args=[refund]))
            assert screenshot(page, f"ux-detail-{suffix}").stat().st_size > 10_000
            page.goto(reverse("effects") + "?q=stripe.*")
            assert screenshot(page, f"ux-search-{suffix}").stat().st_size > 10_000
            page.goto(reverse("effect", args=[email]))
            assert screenshot(page, f"ux-receipt-{suffix}").stat().st_size > 10_000
