"""The operator console in a real browser: Chromium driven by Playwright against the live
server, a person's clicks and keystrokes in, what the page shows and what the ledger
holds out.

Effects are made by an agent in this process (``OpenOnce`` over the console's own ledger
store, committed through the core's connection, hence ``transaction=True``), with
handlers that count their calls, so "the handler ran exactly once" is checked, not
assumed. One browser per module, a fresh context (cookies, storage) per test.

Debian's Chromium is used as installed; nothing is downloaded. Screenshots of the queue
and of an effect's detail page go to ``artifacts/screenshots/`` (gitignored).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, expect
from test_console_views import PASSWORD, fresh_ledger, make_users

from ledger import clients as site_ledger
from openonce_core import (
    ApprovalPending,
    OpenOnce,
    OutcomeUnknownError,
    all_of,
    require_approval_for,
)
from tests.support.browser import TIMEOUT_MS, screenshot, sign_in_with

pytestmark = pytest.mark.django_db(transaction=True)

CONFIRM = "I have checked this effect and confirm the decision"


# -- the agent and its provider -----------------------------------------------------------


class Agent:
    """An agent process on the console's ledger. Its handlers are a fake provider that
    counts every call it receives, per tool and key."""

    def __init__(self) -> None:
        store = site_ledger.get_openonce().store  # shared with the console: never closed
        self.oo = OpenOnce(
            store,
            policy=all_of(
                require_approval_for(["stripe.refund"]), require_approval_for(["wire.*"])
            ),
        )
        self.calls: Counter[str] = Counter()
        self.refund = self.oo.effect(
            self._refund, tool="stripe.refund", idempotency_key=lambda charge, **_: f"re-{charge}"
        )
        self.charge = self.oo.effect(
            self._charge, tool="stripe.charge", idempotency_key=lambda order, **_: f"ch-{order}"
        )
        self.wire = self.oo.effect(
            self._wire, tool="wire.transfer", idempotency_key=lambda account, **_: f"w-{account}"
        )

    def _refund(self, charge: str, amount: int) -> dict[str, Any]:
        self.calls[f"refund {charge}"] += 1
        return {"stripe_id": f"re_{charge}", "amount": amount}

    def _charge(self, order: str, amount: int) -> dict[str, Any]:
        self.calls[f"charge {order}"] += 1
        raise TimeoutError("read timed out after the request was sent")

    def _wire(self, account: str, amount: int) -> dict[str, Any]:
        self.calls[f"wire {account}"] += 1
        return {"wire_id": f"w_{account}"}

    def pending_refund(self, charge: str = "ch_1", amount: int = 500) -> str:
        with pytest.raises(ApprovalPending) as pending:
            self.refund(charge=charge, amount=amount)
        return pending.value.effect_id

    def unknown_charge(self, order: str = "o-1", amount: int = 500) -> str:
        with pytest.raises(OutcomeUnknownError) as unknown:
            self.charge(order=order, amount=amount)
        return unknown.value.effect_id

    def state(self, effect_id: str) -> str:
        return str(self.oo.get(effect_id).state)


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    for _ in fresh_ledger():  # an empty ledger and the four roles; reset afterwards
        yield Agent()


@pytest.fixture
def users(agent: Agent) -> None:
    make_users()  # one person per role, each named after it, all with PASSWORD


# -- the browser --------------------------------------------------------------------------


@pytest.fixture
def page(chromium: Browser, live_server: Any, users: None) -> Iterator[Page]:
    context = chromium.new_context(
        base_url=live_server.url, viewport={"width": 1280, "height": 900}
    )
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    page.on(
        "console",
        lambda msg: (
            errors.append(f"console: {msg.text}")
            if msg.type == "error" and "Failed to load resource" not in msg.text
            else None
        ),
    )
    yield page
    context.close()
    assert errors == [], "the page logged script errors"


def sign_in(page: Page, username: str) -> None:
    sign_in_with(page, username, PASSWORD)


def action(page: Page, name: str) -> Locator:
    """One decision form on the detail page (``approve``, ``resolve-happened``, ...)."""
    return page.locator(f"#action-{name}")


def confirm(form: Locator) -> None:
    # The checkbox itself: its label's ``for`` is not unique on the page (see
    # test_each_confirmation_label_ticks_its_own_box).
    form.locator("input[name=confirm]").check()


def state_badge(page: Page) -> Locator:
    return page.locator("#effect > header .state")


# -- 1. signing in ------------------------------------------------------------------------


def test_sign_in_refuses_a_wrong_password_then_lets_the_person_in(page: Page) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/\?next=/$"))  # sent to sign in first
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()

    page.get_by_label("Username").fill("approver")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text(
        "Please enter a correct username and password"
    )
    expect(page.get_by_label("Username")).to_have_value("approver")  # kept as typed
    expect(page.get_by_label("Password")).to_have_value("")  # never echoed back
    expect(page.locator("form.signout")).to_have_count(0)

    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/$"))
    expect(page.get_by_role("heading", name="Human queue")).to_be_visible()
    expect(page.locator("form.signout")).to_contain_text("approver · approver")
    expect(page.locator("#queue-table")).to_contain_text("Nothing waits for a person.")


# -- 2. approving a pending refund --------------------------------------------------------


def test_approving_a_pending_refund_lets_the_agent_run_it_exactly_once(
    page: Page, agent: Agent
) -> None:
    effect_id = agent.pending_refund("ch_1", 500)
    assert agent.calls["refund ch_1"] == 0  # the agent got ApprovalPending, nothing ran

    sign_in(page, "approver")
    queue = page.locator("#queue-table")
    expect(queue.locator('[data-kind="requires_approval"]')).to_have_text("1")
    row = queue.locator("tbody tr", has=page.locator(f'a[href="/effects/{effect_id}/"]'))
    expect(row).to_contain_text("Awaiting approval")
    expect(row).to_contain_text("stripe.refund")
    expect(row).to_contain_text("charge='ch_1', amount=500")
    screenshot(page, "queue.png")

    # Until the page's load event its deferred htmx may not run yet, and the decision
    # below would go as a plain POST: wait for the whole page, not only its text.
    with page.expect_navigation():
        row.get_by_role("link").click()
    expect(page).to_have_url(re.compile(rf"/effects/{effect_id}/$"))
    expect(page.locator("#effect .crumbs code")).to_have_text(effect_id)
    expect(page.get_by_role("heading", level=1)).to_contain_text("stripe.refund")
    expect(state_badge(page)).to_have_attribute("data-state", "requires_approval")
    identity = page.locator(".card", has=page.get_by_role("heading", name="Decision context"))
    expect(identity).to_contain_text("Approvals0 of 1 distinct approver")
    expect(page.get_by_role("heading", name="Decide")).to_be_visible()
    screenshot(page, "effect-pending.png")

    form = action(page, "approve")
    form.locator("[name=reason]").fill("customer called; refund is due")
    form.get_by_role("button", name="Approve").click()
    # Not confirmed: the browser itself holds the form back, nothing is sent.
    assert form.locator("[name=confirm]").evaluate("box => box.validity.valueMissing")
    assert agent.state(effect_id) == "requires_approval"

    confirm(form)
    form.get_by_role("button", name="Approve").click()
    expect(page.locator("#effect [role=status]")).to_have_text(
        "Approve: done, journaled as operator:approver."
    )
    expect(state_badge(page)).to_have_attribute("data-state", "approved")
    expect(identity).to_contain_text("Approvals1 of 1 distinct approver")
    expect(page.locator(".timeline li").last).to_contain_text("operator:approver")
    expect(page.locator(".timeline li").last).to_contain_text("customer called; refund is due")
    # Approved, not yet run: the approval can still be withdrawn, and nothing else.
    expect(page.locator("form[action$='/approve/']")).to_have_count(0)
    expect(page.locator("form[action$='/deny/']")).to_have_count(1)

    assert agent.state(effect_id) == "approved"
    last = agent.oo.journal(effect_id)[-1]
    assert (last.actor, last.reason) == ("operator:approver", "customer called; refund is due")

    # The agent retries the very same call: it runs now, once, and replays after that.
    receipt = {"stripe_id": "re_ch_1", "amount": 500}
    assert agent.refund(charge="ch_1", amount=500) == receipt
    assert agent.calls["refund ch_1"] == 1
    assert agent.refund(charge="ch_1", amount=500) == receipt
    assert agent.refund(charge="ch_1", amount=500) == receipt
    assert agent.calls["refund ch_1"] == 1
    assert agent.state(effect_id) == "committed"

    page.reload()
    expect(state_badge(page)).to_have_attribute("data-state", "committed")
    expect(page.locator(".card", has=page.get_by_role("heading", name="Receipt"))).to_contain_text(
        '"stripe_id": "re_ch_1"'
    )


# -- 3. resolving an UNKNOWN charge with a receipt ----------------------------------------


def test_resolve_happened_commits_the_receipt_and_the_agent_replays_it(
    page: Page, agent: Agent
) -> None:
    effect_id = agent.unknown_charge("o-1", 500)
    assert agent.calls["charge o-1"] == 1 and agent.state(effect_id) == "unknown"

    sign_in(page, "operator")
    page.goto(f"/effects/{effect_id}/")
    expect(state_badge(page)).to_have_attribute("data-state", "unknown")
    expect(page.locator("#effect")).to_contain_text("read timed out after the request was sent")
    expect(action(page, "approve")).to_have_count(0)  # not the operator's to approve

    form = action(page, "resolve-happened")
    form.locator("[name=receipt]").fill('{"stripe_id": "pi_1"}')
    form.locator("[name=reason]").fill("pi_1 is in the Stripe dashboard")
    confirm(form)
    form.get_by_role("button", name="Resolve: it happened").click()

    expect(page.locator("#effect [role=status]")).to_have_text(
        "Resolve: it happened: done, journaled as operator:operator."
    )
    expect(state_badge(page)).to_have_attribute("data-state", "committed")
    receipt_card = page.locator(".card", has=page.get_by_role("heading", name="Receipt"))
    expect(receipt_card).to_contain_text('"stripe_id": "pi_1"')
    # The receipt and its check, as the journal shows them (one commit).
    receipt_line = page.locator(".timeline li").nth(-2)
    expect(receipt_line).to_contain_text("operator:operator: unknown → receipt_recorded")
    expect(receipt_line).to_contain_text("pi_1 is in the Stripe dashboard")
    expect(page.locator(".timeline li").last).to_contain_text("receipt_recorded → committed")
    screenshot(page, "effect-resolved.png")

    effect = agent.oo.get(effect_id)
    assert (effect.state, effect.result) == ("committed", {"stripe_id": "pi_1"})
    last = agent.oo.journal(effect_id)[-2]
    assert (last.actor, last.reason) == ("operator:operator", "pi_1 is in the Stripe dashboard")
    assert last.evidence["receipt"] == {"stripe_id": "pi_1"}

    # The agent's retry gets the receipt; the provider is not called again.
    assert agent.charge(order="o-1", amount=500) == {"stripe_id": "pi_1"}
    assert agent.calls["charge o-1"] == 1


# -- 4. a rejected receipt ----------------------------------------------------------------


def test_a_rejected_receipt_is_shown_inline_and_nothing_changes(page: Page, agent: Agent) -> None:
    effect_id = agent.unknown_charge("o-2", 700)
    before = agent.oo.get(effect_id)
    journal_before = len(agent.oo.journal(effect_id))

    sign_in(page, "operator")
    page.goto(f"/effects/{effect_id}/")
    form = action(page, "resolve-happened")
    receipt = form.locator("[name=receipt]")

    receipt.fill('{"wrong": 1}')
    confirm(form)
    form.get_by_role("button", name="Resolve: it happened").click()
    # Checked before anything is sent to the core, each problem said once.
    expect(form.locator(".errorlist")).to_contain_text(
        "The receipt breaks the provider contract: receipt is missing required field 'stripe_id'."
    )
    expect(receipt).to_have_value('{"wrong": 1}')  # as typed, to correct it
    expect(state_badge(page)).to_have_attribute("data-state", "unknown")
    expect(page.locator("#effect [role=status]")).to_have_count(0)  # no success notice

    receipt.fill("the charge went through")
    form.get_by_role("button", name="Resolve: it happened").click()
    expect(form.locator(".field.invalid")).to_contain_text("The receipt is not valid JSON")
    expect(receipt).to_have_value("the charge went through")
    expect(state_badge(page)).to_have_attribute("data-state", "unknown")
    screenshot(page, "effect-receipt-refused.png")

    after = agent.oo.get(effect_id)
    assert (after.state, after.fence, after.result) == ("unknown", before.fence, None)
    assert len(agent.oo.journal(effect_id)) == journal_before
    page.reload()
    expect(state_badge(page)).to_have_attribute("data-state", "unknown")


# -- 5. resolving as not happened ---------------------------------------------------------


def test_resolve_not_happened_re_arms_and_journals_the_operator(page: Page, agent: Agent) -> None:
    effect_id = agent.unknown_charge("o-3", 900)
    reason = "not in the Stripe dashboard after 24h"

    sign_in(page, "operator")
    page.goto(f"/effects/{effect_id}/")
    form = action(page, "resolve-not-happened")
    expect(form.locator("[name=override]")).to_have_count(0)  # a Stripe miss is evidence
    form.locator("[name=reason]").fill(reason)
    confirm(form)
    form.get_by_role("button", name="Resolve: it did not happen").click()

    expect(page.locator("#effect [role=status]")).to_have_text(
        "Resolve: it did not happen: done, journaled as operator:operator."
    )
    expect(state_badge(page)).to_have_attribute("data-state", "planned")
    last_line = page.locator(".timeline li").last
    expect(last_line.locator("strong")).to_have_text("operator:operator")
    expect(last_line).to_contain_text("unknown → planned")
    expect(last_line.locator(".reason")).to_have_text(reason)
    expect(action(page, "resolve-happened")).to_have_count(0)

    assert agent.state(effect_id) == "planned"
    last = agent.oo.journal(effect_id)[-1]
    assert (last.actor, last.reason, last.to_state) == ("operator:operator", reason, "planned")
    # Re-armed: the next identical call runs the handler again.
    with pytest.raises(OutcomeUnknownError):
        agent.charge(order="o-3", amount=900)
    assert agent.calls["charge o-3"] == 2


# -- 6. a bulk deny -----------------------------------------------------------------------


def filter_effects(page: Page, state: str, tool: str) -> None:
    page.goto("/effects/")
    filters = page.locator("form.filters")
    filters.get_by_label("State").select_option(state)
    filters.get_by_label("Tool").fill(tool)
    filters.get_by_role("button", name="Filter").click()
    expect(page).to_have_url(re.compile(rf"state={state}&tool={re.escape(tool)}"))


def test_bulk_deny_of_the_pending_refunds(page: Page, agent: Agent) -> None:
    refunds = [agent.pending_refund(f"ch_b{n}", 100 + n) for n in range(3)]
    with pytest.raises(ApprovalPending) as pending:
        agent.wire(account="DE89", amount=10_000)
    wire = pending.value.effect_id  # pending too, but not a refund

    sign_in(page, "approver")
    filter_effects(page, "requires_approval", "stripe.refund")
    results = page.locator("#effect-results tbody tr")
    expect(results).to_have_count(3)
    for effect_id in refunds:
        expect(page.locator(f'#effect-results a[href="/effects/{effect_id}/"]')).to_have_count(1)

    # The bulk form is built with the page; load the filtered address as a whole page so
    # it carries the filter (see test_bulk_count_follows_a_filter_applied_in_place).
    page.reload()
    bulk = page.locator("form", has=page.get_by_label("Bulk action on this filter"))
    bulk.get_by_label("Bulk action on this filter").select_option("deny")
    with page.expect_navigation():  # loaded: the apply form below is htmx's to send
        bulk.get_by_role("button", name="Count matching effects…").click()

    expect(page.get_by_role("heading", name="Bulk deny")).to_be_visible()
    count = page.locator("#bulk strong[data-count]")
    expect(count).to_have_text("3 effects")
    expect(page.locator("#bulk")).to_contain_text("3 effects match this filter and can be denied.")
    expect(page.locator("#bulk tbody tr")).to_have_count(3)
    expect(page.locator(f'#bulk a[href="/effects/{wire}/"]')).to_have_count(0)

    apply_form = page.locator("#bulk form")
    apply_form.locator("[name=reason]").fill("duplicate refund requests")
    apply_form.locator("[name=confirm]").check()
    apply_form.get_by_role("button", name="Deny these effects").click()

    expect(page.locator("#bulk [role=status]")).to_have_text(
        "Deny applied effect by effect: 3 applied, 0 skipped because they changed since they"
        " were counted, 0 refused."
    )
    for effect_id in refunds:
        row = page.locator("#bulk tr.result-applied", has=page.locator(f'a[href*="{effect_id}"]'))
        expect(row).to_contain_text("applied")
        expect(row).to_contain_text("now denied")
    expect(page.locator("#bulk tbody tr")).to_have_count(3)

    assert [agent.state(e) for e in refunds] == ["denied"] * 3
    assert agent.state(wire) == "requires_approval"
    for effect_id in refunds:
        last = agent.oo.journal(effect_id)[-1]
        assert (last.actor, last.reason) == ("operator:approver", "duplicate refund requests")
    assert sum(agent.calls.values()) == 0  # nothing denied ever reached the provider


def test_bulk_count_follows_a_filter_applied_in_place(page: Page, agent: Agent) -> None:
    for n in range(3):
        agent.pending_refund(f"ch_f{n}", 10 + n)
    with pytest.raises(ApprovalPending):
        agent.wire(account="FR76", amount=5_000)

    sign_in(page, "approver")
    filter_effects(page, "requires_approval", "stripe.refund")
    expect(page.locator("#effect-results tbody tr")).to_have_count(3)
    bulk = page.locator("form", has=page.get_by_label("Bulk action on this filter"))
    bulk.get_by_label("Bulk action on this filter").select_option("deny")
    bulk.get_by_role("button", name="Count matching effects…").click()
    # What the person filtered to, and saw listed: three refunds.
    expect(page.locator("#bulk strong[data-count]")).to_have_text("3 effects")


# -- 7. a viewer ---------------------------------------------------------------------------


def test_a_viewer_sees_no_actions_and_a_forged_post_is_refused(page: Page, agent: Agent) -> None:
    effect_id = agent.pending_refund("ch_v", 300)
    fence = agent.oo.get(effect_id).fence

    sign_in(page, "viewer")
    page.goto(f"/effects/{effect_id}/")
    expect(state_badge(page)).to_have_attribute("data-state", "requires_approval")
    expect(page.get_by_role("heading", name="Decide")).to_have_count(0)
    expect(page.locator("form.action")).to_have_count(0)
    decisions = page.get_by_role("button", name=re.compile("Approve|Deny|Cancel|Resolve"))
    expect(decisions).to_have_count(0)  # copy buttons, search and sign-out only

    # The token a page gives to anyone signed in, used to forge the approval form.
    token = page.locator("form.signout [name=csrfmiddlewaretoken]").get_attribute("value")
    assert token
    forged = page.request.post(
        f"/effects/{effect_id}/approve/",
        form={"csrfmiddlewaretoken": token, "fence": str(fence), "confirm": "on", "reason": "x"},
        max_redirects=0,
    )
    assert forged.status == 403
    assert "Your role does not include this" in forged.text()  # not a CSRF refusal

    # The same through the page's own fetch, as htmx would send it.
    status, body = page.evaluate(
        """async ([url, fence]) => {
            const headers = JSON.parse(document.body.getAttribute("hx-headers"));
            const response = await fetch(url, {
                method: "POST", headers: {...headers, "HX-Request": "true"},
                body: new URLSearchParams({fence, confirm: "on", reason: "forged"}),
            });
            return [response.status, await response.text()];
        }""",
        [f"/effects/{effect_id}/deny/", str(fence)],
    )
    assert status == 403 and "Your role does not include this" in body

    effect = agent.oo.get(effect_id)
    assert (effect.state, effect.fence) == ("requires_approval", fence)
    assert agent.oo.approvals(effect_id) == []
    assert [j.actor for j in agent.oo.journal(effect_id) if j.actor.startswith("operator:")] == []
    page.reload()
    expect(state_badge(page)).to_have_attribute("data-state", "requires_approval")
    expect(
        page.locator(".card", has=page.get_by_role("heading", name="Approvals"))
    ).to_contain_text("No one has decided on it.")


# -- 8. the queue updates itself ------------------------------------------------------------


def test_the_queue_shows_a_new_pending_effect_without_a_reload(page: Page, agent: Agent) -> None:
    first = agent.pending_refund("ch_q1", 100)
    sign_in(page, "viewer")
    queue = page.locator("#queue-table")
    expect(queue.locator(f'a[href="/effects/{first}/"]')).to_have_count(1)
    expect(queue.locator('[data-kind="requires_approval"]')).to_have_text("1")
    page.evaluate("window.__stillTheSamePage = 'yes'")
    url = page.url

    # The table asks every 5 s: the new row comes with one of the next asks (three periods
    # leave room for a loaded machine), not with a reload, which never happens here.
    started = time.monotonic()
    second = agent.pending_refund("ch_q2", 200)
    new_row = queue.locator("tbody tr", has=page.locator(f'a[href="/effects/{second}/"]'))
    expect(new_row).to_be_visible(timeout=15_000)
    assert time.monotonic() - started < 15.5
    expect(new_row).to_contain_text("Awaiting approval")
    expect(new_row).to_contain_text("charge='ch_q2', amount=200")
    expect(queue.locator('[data-kind="requires_approval"]')).to_have_text("2")
    expect(queue.locator("tbody tr")).to_have_count(2)

    assert page.evaluate("window.__stillTheSamePage") == "yes"  # no navigation happened
    assert page.url == url
    assert agent.state(second) == "requires_approval"


# -- a bug found in the browser -------------------------------------------------------------


def test_each_confirmation_label_ticks_its_own_box(page: Page, agent: Agent) -> None:
    effect_id = agent.unknown_charge("o-4", 100)
    sign_in(page, "operator")
    page.goto(f"/effects/{effect_id}/")
    happened, not_happened = action(page, "resolve-happened"), action(page, "resolve-not-happened")

    not_happened.get_by_text(CONFIRM).click()  # a person clicks the label's words

    # The box in the form clicked, and only that one.
    expect(not_happened.locator("[name=confirm]")).to_be_checked()
    expect(happened.locator("[name=confirm]")).not_to_be_checked()
