"""The operator console as a person uses it: the human queue, the effects list, an
effect's detail page, each decision and its inline errors, exports, provider knowledge
and reconciler health.

Effects are made by a real agent (``OpenOnce`` over the console's own ledger store) and
committed through the core's connection, hence ``transaction=True``. Every POST carries
a CSRF token: the client enforces CSRF checks like a browser.

The fixtures here are shared with test_console_security.py and test_console_bulk.py.
"""

from __future__ import annotations

import contextlib
import csv
import inspect
import io
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from console import selectors
from console.roles import ROLES, sync_roles
from ledger import clients as site_ledger
from openonce_core import (
    ApprovalPending,
    OpenOnce,
    OutcomeUnknownError,
    ReceiptContractError,
    UnknownOutcomeError,
    all_of,
    require_approval_for,
)
from openonce_core.testing import FakeClock

PASSWORD = "correct horse battery staple"
CSRF = "c" * 32  # a CSRF secret as the cookie holds it; the header repeats it
UNKNOWN = object()  # a handler outcome: raise "may have happened"
PEPPER = b"console-tests-pepper-0123456789"
CARD = "4242424242424242"

pytestmark = pytest.mark.django_db(transaction=True)


# -- shared fixtures ----------------------------------------------------------------------


class Agent:
    """Makes effects the way an agent process does, on the console's ledger."""

    def __init__(self, clock: Any = None) -> None:
        store = site_ledger.get_openonce().store  # shared: never closed here
        policy = all_of(
            require_approval_for(["stripe.refund"]),
            require_approval_for(["wire.*"], approvers=2),
        )
        self.oo = OpenOnce(store, policy=policy, secret_pepper=PEPPER, clock=clock)
        # Holds handlers to the provider receipt contract: a bad receipt -> human review.
        self.strict = OpenOnce(store, enforce_provider_receipts=True, clock=clock)

    def call(
        self,
        tool: str,
        outcome: Any = None,
        *,
        secret_fields: tuple[str, ...] = (),
        strict: bool = False,
        **args: Any,
    ) -> str:
        """Run one call of ``tool`` with ``args``; return its effect id, whatever happened."""
        key = "k-" + uuid.uuid4().hex
        oo = self.strict if strict else self.oo
        fn = oo.effect(
            _handler(list(args), {"ok": True} if outcome is None else outcome),
            tool=tool,
            idempotency_key=lambda **_: key,
            secret_fields=secret_fields,
        )
        with contextlib.suppress(ApprovalPending, OutcomeUnknownError, ReceiptContractError):
            fn(**args)
        effect = oo.store.find(tool, key)
        assert effect is not None
        return effect.id

    def pending(self, tool: str = "stripe.refund", **args: Any) -> str:
        return self.call(tool, **(args or {"charge": "ch_1", "amount": 500}))

    def unknown(self, tool: str = "stripe.charge", **args: Any) -> str:
        return self.call(tool, UNKNOWN, **(args or {"order": "o-1", "amount": 500}))

    def human_review(self, **args: Any) -> str:
        # stripe.charge promises a stripe_id in its receipt; this handler returns none.
        return self.call(
            "stripe.charge", {"status": "ok"}, strict=True, **(args or {"order": "hr"})
        )

    def state(self, effect_id: str) -> str:
        return str(self.oo.get(effect_id).state)

    def fence(self, effect_id: str) -> int:
        return self.oo.get(effect_id).fence

    def journal(self, effect_id: str) -> list[Any]:
        return self.oo.journal(effect_id)


def _handler(names: list[str], outcome: Any) -> Callable[..., Any]:
    def handler(**kwargs: Any) -> Any:
        if outcome is UNKNOWN:
            raise UnknownOutcomeError("connection reset after the request was sent")
        return outcome

    # The decorator reads parameter names (for secret_fields and binding) from here.
    handler.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    )
    return handler


def fresh_ledger() -> Iterator[Agent]:
    """The test database's ledger, emptied, and the roles as the migration made them (a
    transactional test's flush removes the groups). The fixtures of all three console
    test files are this generator."""
    site_ledger.reset()
    with psycopg.connect(site_ledger.ledger_target(), autocommit=True) as conn:
        conn.execute("TRUNCATE openonce_effects, openonce_journal, openonce_approvals")
    sync_roles()
    yield Agent()
    site_ledger.reset()


def make_users() -> dict[str, User]:
    """One person per role, plus a second approver and someone with no role at all."""
    people = {}
    for username, role in [*((r, r) for r in ROLES), ("approver2", "approver"), ("norole", None)]:
        user = User.objects.create_user(username, password=PASSWORD)
        if role:
            user.groups.add(Group.objects.get(name=role))
        people[username] = user
    return people


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> dict[str, User]:
    return make_users()


def client_for(user: User | None) -> Client:
    """A browser-like client: CSRF enforced, the CSRF cookie set as a page would set it."""
    client = Client(enforce_csrf_checks=True)
    client.cookies["csrftoken"] = CSRF
    if user is not None:
        client.force_login(user)
    return client


def post(client: Client, url: str, data: dict[str, Any] | None = None, **extra: Any) -> Any:
    return client.post(url, data or {}, HTTP_X_CSRFTOKEN=CSRF, **extra)


def decide(client: Client, action: str, effect_id: str, fence: int, **fields: Any) -> Any:
    data = {"fence": fence, "confirm": "on", **fields}
    return post(client, reverse(action, args=[effect_id]), data)


def html(response: Any) -> str:
    return response.content.decode()


# -- the human queue ----------------------------------------------------------------------


def test_queue_shows_what_waits_for_a_person_oldest_first(agent: Agent, users) -> None:
    pending = agent.pending(charge="ch_queue", amount=1250)
    review = agent.human_review()
    overdue = agent.unknown("ledger.sync", order="o-9")  # no capability: no grace window
    young = agent.unknown("stripe.charge", order="o-young")  # inside Stripe's 120 s grace
    done = agent.call("email.send", {"message_id": "<m1>"}, to="a@example.com")

    page = html(client_for(users["viewer"]).get(reverse("queue")))

    for effect_id in (pending, review, overdue):
        assert effect_id in page
    assert young not in page and done not in page
    assert page.index(pending) < page.index(review) < page.index(overdue)  # oldest first
    assert 'data-kind="requires_approval">1<' in page
    assert 'data-kind="human_review">1<' in page
    assert 'data-kind="unknown">1<' in page
    assert "stripe.refund" in page and "ledger.sync" in page
    assert "charge=&#x27;ch_queue&#x27;, amount=1250" in page  # the argument summary
    assert "evidence tier 1" in page  # how far a Stripe probe can be trusted
    assert ">unknown<" in page  # ledger.sync has no capability
    assert "risk" not in page.lower().split("<main")[1]  # a tier is not a risk
    # Who asked: the journal's first line names the agent process (host:pid:token); the
    # queue says its host and pid, not the token.
    host, pid, token = agent.journal(pending)[0].actor.removeprefix("agent:").rsplit(":", 2)
    assert f"{host} pid {pid}" in page and token not in page
    assert "not probed yet" in page  # the UNKNOWN effects


def test_queue_kind_filter_is_in_the_url(agent: Agent, users) -> None:
    pending = agent.pending()
    overdue = agent.unknown("ledger.sync")
    page = html(client_for(users["viewer"]).get(reverse("queue"), {"kind": "unknown"}))
    assert overdue in page and pending not in page
    assert 'data-kind="requires_approval">1<' in page  # counts stay complete


def test_queue_poll_replaces_only_its_table_and_holds_no_form(agent: Agent, users) -> None:
    pending = agent.pending()
    client = client_for(users["viewer"])
    response = client.get(reverse("queue"), HTTP_HX_REQUEST="true")
    fragment = html(response)
    assert response.status_code == 200
    assert fragment.lstrip().startswith('<section id="queue-table"')
    assert 'hx-trigger="every 5s"' in fragment
    # Morphed in place (idiomorph), each row with a stable id, so focus survives.
    assert 'hx-ext="morph"' in fragment and 'hx-swap="morph:outerHTML"' in fragment
    assert f'id="row-{pending}"' in fragment
    assert 'data-title="(1) Human queue' in fragment  # the tab title carries the count
    assert pending in fragment
    assert "<html" not in fragment and "<form" not in fragment
    assert "HX-Request" in response["Vary"]
    # The full page polls that table, and the health panel on its own.
    page = html(client.get(reverse("queue")))
    assert re.search(r'id="queue-table"[^>]*hx-get="/\?since=[0-9.]+"', page)
    assert "<title>(1) Human queue" in page
    assert 'id="health-panel"' in page


# -- the effects list ---------------------------------------------------------------------


def test_effects_list_filters_by_state_tool_scope_and_key(agent: Agent, users) -> None:
    refund = agent.pending()
    unknown = agent.unknown("stripe.charge")
    email = agent.call("email.send", {"message_id": "<m>"}, to="b@example.com")
    client = client_for(users["viewer"])

    def listed(**query: str) -> str:
        response = client.get(reverse("effects"), query)
        assert response.status_code == 200
        return html(response)

    page = listed(state="unknown")
    assert unknown in page and refund not in page and email not in page
    page = listed(tool="email.send")
    assert email in page and refund not in page
    key = agent.oo.get(refund).idempotency_key
    page = listed(key=key)
    assert refund in page and unknown not in page
    page = listed(tool="stripe.refund", state="committed")
    assert "No effect matches this filter." in page


def test_effects_list_scope_filter_and_keyset_pages_keep_the_filter(
    agent: Agent, users, monkeypatch
) -> None:
    from ledger.models import Effect

    monkeypatch.setattr(selectors, "PAGE_SIZE", 2)
    with agent.oo.scope("run-42") as scope:
        made = [agent.call("demo.step", n=n) for n in range(5)]
    outsider = agent.call("demo.step", n=99)
    client = client_for(users["viewer"])

    seen: list[str] = []
    url = reverse("effects") + f"?scope={scope}"
    for _ in range(5):
        page = html(client.get(url))
        seen += sorted((e for e in [*made, outsider] if e in page), key=page.index)
        if 'rel="next"' not in page:
            break
        url = re.search(r'<a rel="next" href="([^"]+)"', page)[1].replace("&amp;", "&")
        assert f"scope={scope}" in url and "after=" in url  # the filter stays in the URL
    newest_first = Effect.objects.filter(scope=scope).order_by("-created_at", "-id")
    assert seen == [e.id for e in newest_first]  # every one, once, in order
    assert len(seen) == 5 and outsider not in seen


def test_effects_list_time_range_and_stuck_filters(agent: Agent, users) -> None:
    an_hour_ago = Agent(clock=FakeClock(time.time() - 3600))  # an agent whose call was then
    old = an_hour_ago.pending(charge="ch_old", amount=1)
    fresh = agent.pending(charge="ch_new", amount=2)
    client = client_for(users["viewer"])

    page = html(client.get(reverse("effects"), {"stuck": "30m"}))
    assert old in page and fresh not in page
    since = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M")
    page = html(client.get(reverse("effects"), {"created_from": since}))
    assert fresh in page and old not in page
    page = html(client.get(reverse("effects"), {"created_to": since}))
    assert old in page and fresh not in page

    response = client.get(reverse("effects"), {"stuck": "a while"})
    assert response.status_code == 400
    assert "Write a duration such as 90s, 15m, 2h or 1d." in html(response)


# -- the detail page ----------------------------------------------------------------------


def test_detail_shows_everything_a_decision_needs(agent: Agent, users) -> None:
    effect_id = agent.call(
        "stripe.charge", UNKNOWN, secret_fields=("card",), order="o-7", amount=900, card=CARD
    )
    effect = agent.oo.get(effect_id)
    page = html(client_for(users["operator"]).get(reverse("effect", args=[effect_id])))

    assert CARD not in page
    # An operator sees the digest's scheme and a short prefix, never the whole digest.
    scheme, digest = effect.args["card"].split(":")
    assert f"secret · {scheme}:{digest[:8]}…" in page and digest not in page
    assert effect.args_fingerprint in page and effect.provider_key in page
    assert "Execution evidence" in page and "Verification evidence" in page
    assert "connection reset after the request was sent" in page  # the recorded error
    assert "attempt 1 of 3" in page
    # The journal as a timeline: who, from -> to, reason.
    assert "<strong>agent:" in page and "planned →" in page and "may have happened" in page
    # Who asked, in the decision context: the agent's host and pid.
    host, pid, _ = agent.oo.journal(effect_id)[0].actor.removeprefix("agent:").rsplit(":", 2)
    assert f'agent on host <code class="wrap">{host}</code>, pid {pid}' in page
    # The provider capability's guidance.
    assert "inconclusive inside the index lag window, then not-happened" in page
    assert "pass current_effect().provider_key as Stripe Idempotency-Key" in page
    assert "<code>stripe_id</code>" in page
    # An operator may resolve it; approve is not offered.
    assert 'id="action-resolve-happened"' in page
    assert 'id="action-resolve-not-happened"' in page
    assert 'id="action-approve"' not in page
    assert f'name="fence" value="{effect.fence}"' in page


def test_detail_offers_only_the_decisions_the_role_holds(agent: Agent, users) -> None:
    pending = agent.pending()
    url = reverse("effect", args=[pending])
    viewer = html(client_for(users["viewer"]).get(url))
    approver = html(client_for(users["approver"]).get(url))
    operator = html(client_for(users["operator"]).get(url))
    assert "<h2>Decide</h2>" not in viewer
    assert 'id="action-approve"' in approver and 'id="action-deny"' in approver
    assert 'id="action-cancel"' not in approver
    assert 'id="action-cancel"' in operator and 'id="action-approve"' not in operator


# -- decisions ----------------------------------------------------------------------------


def test_approve_moves_the_effect_and_journals_the_person(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["approver"])
    response = decide(client, "approve", effect_id, agent.fence(effect_id), reason="refund ok")
    assert response.status_code == 302
    assert response["Location"] == reverse("effect", args=[effect_id])
    assert agent.state(effect_id) == "approved"
    last = agent.journal(effect_id)[-1]
    assert (last.actor, last.reason, last.to_state) == (
        "operator:approver",
        "refund ok",
        "approved",
    )
    page = html(client.get(response["Location"]))
    assert "Approve: done, journaled as operator:approver." in page


def test_deny_needs_a_reason_and_records_it(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["approver"])
    fence = agent.fence(effect_id)

    response = decide(client, "deny", effect_id, fence, reason="  ")
    assert response.status_code == 400
    assert "A reason is required" in html(response)
    assert agent.state(effect_id) == "requires_approval"

    response = decide(client, "deny", effect_id, fence, reason="customer withdrew")
    assert response.status_code == 302
    assert agent.state(effect_id) == "denied"
    last = agent.journal(effect_id)[-1]
    assert (last.actor, last.reason) == ("operator:approver", "customer withdrew")


def test_decisions_need_the_confirmation(agent: Agent, users) -> None:
    effect_id = agent.pending()
    response = post(
        client_for(users["approver"]),
        reverse("approve", args=[effect_id]),
        {"fence": agent.fence(effect_id)},
    )
    assert response.status_code == 400
    assert "Tick the box to confirm the decision." in html(response)
    assert agent.state(effect_id) == "requires_approval"


def test_cancel_records_operator_and_reason(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["operator"])
    response = decide(client, "cancel", effect_id, agent.fence(effect_id), reason="duplicate order")
    assert response.status_code == 302
    assert agent.state(effect_id) == "cancelled"
    last = agent.journal(effect_id)[-1]
    assert (last.actor, last.reason) == ("operator:operator", "duplicate order")


def test_a_stale_page_is_refused_inline(agent: Agent, users) -> None:
    effect_id = agent.pending()
    stale = agent.fence(effect_id)
    agent.oo.cancel(effect_id, by="someone-else", reason="changed mind")  # after the page
    response = decide(client_for(users["approver"]), "deny", effect_id, stale, reason="no")
    assert response.status_code == 409
    page = html(response)
    assert "changed since you looked at it" in page
    assert 'id="action-deny"' in page and 'value="no"' in page  # the form, as typed
    assert [j.reason for j in agent.journal(effect_id)][-1] == "changed mind"


def test_an_illegal_decision_is_refused_inline(agent: Agent, users) -> None:
    effect_id = agent.unknown()
    response = decide(
        client_for(users["operator"]), "cancel", effect_id, agent.fence(effect_id), reason="x"
    )
    assert response.status_code == 409
    assert "cannot cancel effect" in html(response)
    assert agent.state(effect_id) == "unknown"


def test_resolve_happened_checks_the_receipt_before_committing(agent: Agent, users) -> None:
    effect_id = agent.unknown("stripe.charge")
    client = client_for(users["operator"])
    fence = agent.fence(effect_id)

    response = decide(client, "resolve-happened", effect_id, fence, receipt="{not json")
    assert response.status_code == 400
    assert "The receipt is not valid JSON" in html(response)

    response = decide(client, "resolve-happened", effect_id, fence, receipt="[1, 2]")
    assert response.status_code == 400
    assert "must be a non-empty JSON object" in html(response)

    receipt = json.dumps({"charge": "ch_9"})
    response = decide(client, "resolve-happened", effect_id, fence, receipt=receipt)
    assert response.status_code == 400
    assert "receipt is missing required field &#x27;stripe_id&#x27;" in html(response)
    assert agent.state(effect_id) == "unknown"

    # The template's empty fields must be filled in, not committed empty.
    response = decide(client, "resolve-happened", effect_id, fence, receipt='{"stripe_id": ""}')
    assert response.status_code == 400
    assert "Fill in or remove the empty field stripe_id" in html(response)
    assert agent.state(effect_id) == "unknown"

    receipt = json.dumps({"stripe_id": "ch_9"})
    response = decide(
        client, "resolve-happened", effect_id, fence, receipt=receipt, reason="seen in dashboard"
    )
    assert response.status_code == 302
    effect = agent.oo.get(effect_id)
    assert (effect.state, effect.result) == ("committed", {"stripe_id": "ch_9"})
    last, verdict = agent.journal(effect_id)[-2:]  # the receipt, then its check
    assert (last.actor, last.reason) == ("operator:operator", "seen in dashboard")
    assert last.evidence["receipt"] == {"stripe_id": "ch_9"}
    assert (verdict.action, verdict.to_state) == ("check_receipt", "committed")


def test_resolve_not_happened_needs_a_reason(agent: Agent, users) -> None:
    effect_id = agent.unknown("stripe.charge")
    response = decide(
        client_for(users["operator"]), "resolve-not-happened", effect_id, agent.fence(effect_id)
    )
    assert response.status_code == 400
    assert "A reason is required" in html(response)
    assert agent.state(effect_id) == "unknown"


def test_resolve_not_happened_re_arms_where_a_miss_is_evidence(agent: Agent, users) -> None:
    effect_id = agent.unknown("stripe.charge")
    page = html(client_for(users["admin"]).get(reverse("effect", args=[effect_id])))
    assert "Override: re-arm" not in page  # not needed where a miss is evidence
    response = decide(
        client_for(users["operator"]),
        "resolve-not-happened",
        effect_id,
        agent.fence(effect_id),
        reason="not in the Stripe dashboard after 24h",
    )
    assert response.status_code == 302
    assert agent.state(effect_id) == "planned"
    last = agent.journal(effect_id)[-1]
    assert (last.actor, last.reason) == (
        "operator:operator",
        "not in the Stripe dashboard after 24h",
    )
    assert "override" not in last.evidence


def test_resolve_not_happened_on_email_needs_the_override(agent: Agent, users, caplog) -> None:
    effect_id = agent.unknown("email.send", to="c@example.com")
    url = reverse("effect", args=[effect_id])
    assert "Override: re-arm" not in html(client_for(users["operator"]).get(url))
    assert "Override: re-arm" in html(client_for(users["admin"]).get(url))

    # An operator without the override permission: refused inline, nothing changes.
    operator = client_for(users["operator"])
    fence = agent.fence(effect_id)
    response = decide(operator, "resolve-not-happened", effect_id, fence, reason="no bounce")
    assert response.status_code == 409
    assert "not safe to re-arm on a miss" in html(response)
    assert agent.state(effect_id) == "unknown"
    # Asking for the override without holding it is a permission denial, logged.
    response = decide(
        operator, "resolve-not-happened", effect_id, fence, reason="no bounce", override="on"
    )
    assert response.status_code == 403
    assert "lacks console.override_rearm" in caplog.text
    assert agent.state(effect_id) == "unknown"

    # The admin holds it and says so explicitly: re-armed, and the journal keeps the override.
    admin = client_for(users["admin"])
    response = decide(admin, "resolve-not-happened", effect_id, fence, reason="no bounce")
    assert response.status_code == 409  # the permission alone is not the decision
    response = decide(
        admin,
        "resolve-not-happened",
        effect_id,
        fence,
        reason="SMTP log: never sent",
        override="on",
    )
    assert response.status_code == 302
    assert agent.state(effect_id) == "planned"
    last = agent.journal(effect_id)[-1]
    assert last.actor == "operator:admin" and last.reason == "SMTP log: never sent"
    assert "re-armed although a miss is not evidence" in last.evidence["override"]
    page = html(admin.get(url))
    assert "re-armed although a miss is not evidence" in page


def test_two_distinct_approvers_and_nobody_twice(agent: Agent, users) -> None:
    effect_id = agent.call("wire.transfer", account="DE89", amount=10_000_00)
    first, second = client_for(users["approver"]), client_for(users["approver2"])

    assert decide(first, "approve", effect_id, agent.fence(effect_id)).status_code == 302
    assert agent.state(effect_id) == "requires_approval"
    page = html(first.get(reverse("effect", args=[effect_id])))
    assert "1 of 2 distinct approvers" in page

    response = decide(first, "approve", effect_id, agent.fence(effect_id))
    assert response.status_code == 409
    assert "approver already approved" in html(response)
    assert agent.state(effect_id) == "requires_approval"

    assert decide(second, "approve", effect_id, agent.fence(effect_id)).status_code == 302
    assert agent.state(effect_id) == "approved"
    actors = [j.actor for j in agent.journal(effect_id) if j.actor.startswith("operator:")]
    assert actors == ["operator:approver", "operator:approver2"]


def test_htmx_decisions_swap_fragments(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["approver"])
    fence = agent.fence(effect_id)
    url = reverse("deny", args=[effect_id])

    response = post(client, url, {"fence": fence, "confirm": "on"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    fragment = html(response)
    assert fragment.lstrip().startswith('<form id="action-deny"')
    assert "A reason is required" in fragment and "<html" not in fragment

    response = post(
        client, url, {"fence": fence, "confirm": "on", "reason": "fraud"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    assert response["HX-Retarget"] == "#effect" and response["HX-Reswap"] == "outerHTML"
    fragment = html(response)
    assert fragment.lstrip().startswith('<article id="effect">')
    assert "Deny: done, journaled as operator:approver." in fragment
    assert agent.state(effect_id) == "denied"


# -- exports ------------------------------------------------------------------------------


def test_effect_journal_exports_as_csv_and_json(agent: Agent, users) -> None:
    effect_id = agent.pending()
    agent.oo.deny(effect_id, by="approver", reason='=HYPERLINK("x")')
    client = client_for(users["viewer"])

    response = client.get(reverse("effect-journal-csv", args=[effect_id]))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == f'attachment; filename="{effect_id}-journal.csv"'
    rows = list(csv.reader(io.StringIO(html(response))))
    assert rows[0] == [
        "seq",
        "at",
        "effect_id",
        "actor",
        "from_state",
        "to_state",
        "reason",
        "evidence",
    ]
    assert [r[5] for r in rows[1:]] == ["requires_approval", "denied"]
    assert rows[2][3] == "operator:approver"
    assert rows[2][6] == '\'=HYPERLINK("x")'  # no formula for a spreadsheet to run

    response = client.get(reverse("effect-journal-json", args=[effect_id]))
    assert response["Content-Disposition"].startswith("attachment;")
    document = json.loads(response.content)
    assert document["effect_id"] == effect_id and document["state"] == "denied"
    assert [j["to_state"] for j in document["journal"]] == ["requires_approval", "denied"]
    assert document["journal"][1]["reason"] == '=HYPERLINK("x")'  # JSON keeps it as is


def test_audit_log_lists_only_operator_decisions(agent: Agent, users) -> None:
    first = agent.pending()
    second = agent.pending(charge="ch_2", amount=2)
    agent.oo.approve(first, by="approver", reason="ok")
    agent.oo.deny(second, by="approver", reason="no")
    client = client_for(users["admin"])

    page = html(client.get(reverse("audit")))
    assert page.index(second) < page.index(first)  # newest first
    assert "operator:approver" in page and "agent:" not in page

    rows = list(csv.reader(io.StringIO(html(client.get(reverse("audit-csv"))))))
    assert rows[0][0] == "seq" and len(rows) == 3
    assert {r[3] for r in rows[1:]} == {"operator:approver"}
    response = client.get(reverse("audit-json"))
    assert response["Content-Disposition"] == 'attachment; filename="openonce-operator-audit.json"'
    document = json.loads(response.content)
    assert [j["effect_id"] for j in document["journal"]] == [second, first]
    assert document["next_before"] is None

    newest = document["journal"][0]["seq"]
    older = json.loads(client.get(reverse("audit-json"), {"before": newest}).content)
    assert [j["effect_id"] for j in older["journal"]] == [first]
    assert client.get(reverse("audit"), {"before": "x"}).status_code == 400


# -- provider knowledge and reconciler health ---------------------------------------------


def test_capabilities_page_shows_matrix_guidance_and_readiness(agent: Agent, users) -> None:
    page = html(client_for(users["viewer"]).get(reverse("capabilities")))
    for name in ("stripe", "github_pr", "email_provider_api", "email_smtp"):
        assert f'id="cap-{name}"' in page
    assert "inconclusive forever: sent copy can fail after delivery" in page
    assert "a miss is not evidence: never re-arm without a person&#x27;s decision" in page
    assert "reviewed" in page
    # No prober is registered in the tests: said once per row, never beside "ready".
    assert "none registered" in page and ">ready<" not in page
    assert 'id="health-panel"' in page


def test_reconciler_panel_turns_red_when_sweeps_stop(agent: Agent, users) -> None:
    from django.utils import timezone

    from reconciler.models import Sweep

    client = client_for(users["viewer"])
    page = html(client.get(reverse("reconciler"), HTTP_HX_REQUEST="true"))
    assert 'class="card health bad"' in page and "no sweep has run yet" in page

    stopped = timezone.now() - timedelta(minutes=10)
    Sweep.objects.create(source="beat", started_at=stopped, finished_at=stopped)
    page = html(client.get(reverse("reconciler")))
    assert "NOT healthy" in page and "beat or workers stopped" in page

    Sweep.objects.create(source="beat", started_at=timezone.now(), finished_at=timezone.now())
    fragment = html(client.get(reverse("reconciler"), HTTP_HX_REQUEST="true"))
    assert 'class="card health"' in fragment and "Reconciler healthy" in fragment
    assert 'hx-trigger="every 10s"' in fragment
