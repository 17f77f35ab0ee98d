"""Bulk approve, deny and cancel on a filter: the preview counts and names the effects,
the apply step acts on exactly that set, effect by effect, and reports each result. An
effect that changed in between is skipped, one that appeared in between is not touched."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from test_console_views import (
    Agent,
    client_for,
    fresh_ledger,
    html,
    make_users,
    post,
)

from console import selectors

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(transactional_db: None) -> Iterator[Agent]:
    yield from fresh_ledger()


@pytest.fixture
def users(agent: Agent) -> dict[str, User]:
    return make_users()


def preview(client, **query: str):
    response = client.get(reverse("bulk"), query)
    return response, html(response)


def token_of(page: str) -> str:
    return re.search(r'name="token" value="([^"]+)"', page)[1]


def apply(client, token: str, **fields: str):
    return post(client, reverse("bulk-apply"), {"token": token, "confirm": "on", **fields})


def test_bulk_approve_applies_to_exactly_the_counted_set(agent: Agent, users) -> None:
    with agent.oo.scope("batch-1") as batch:
        counted = [agent.pending(charge=f"ch_{n}", amount=n + 1) for n in range(3)]
    outsider = agent.pending(charge="ch_other", amount=9)
    client = client_for(users["approver"])

    response, page = preview(client, action="approve", scope=batch)
    assert response.status_code == 200
    assert 'data-count="3">3 effects</strong> match this filter and can be approved' in page
    assert all(e in page for e in counted) and outsider not in page

    # Between the count and the confirmation: one is decided elsewhere, one more arrives.
    agent.oo.cancel(counted[1], by="approver2", reason="handled by phone")
    with agent.oo.scope(batch):
        late = agent.pending(charge="ch_late", amount=4)

    response = apply(client, token_of(page), reason="month-end refunds")
    assert response.status_code == 200
    page = html(response)
    assert "2 applied, 1 skipped because they changed since they were counted, 0 refused" in page
    assert 'class="result-skipped"' in page and "changed since you looked at it" in page
    assert [agent.state(e) for e in counted] == ["approved", "cancelled", "approved"]
    assert agent.state(late) == "requires_approval"  # not counted, not touched
    assert agent.state(outsider) == "requires_approval"
    for effect_id in (counted[0], counted[2]):
        last = agent.journal(effect_id)[-1]
        assert (last.actor, last.reason) == ("operator:approver", "month-end refunds")


def test_bulk_deny_and_cancel_need_a_reason(agent: Agent, users) -> None:
    with agent.oo.scope("batch-2") as batch:
        effects = [agent.pending(charge=f"ch_d{n}", amount=n + 1) for n in range(2)]
    approver = client_for(users["approver"])

    _, page = preview(approver, action="deny", scope=batch)
    token = token_of(page)
    response = apply(approver, token)
    assert response.status_code == 400
    assert "A reason is required" in html(response)
    assert f"The counted set: <code>{effects[0]}</code>" in html(response)
    assert [agent.state(e) for e in effects] == ["requires_approval"] * 2

    response = apply(approver, token, reason="fraud ring")
    assert "2 applied, 0 skipped" in html(response)
    assert [agent.state(e) for e in effects] == ["denied"] * 2
    assert agent.journal(effects[0])[-1].reason == "fraud ring"

    with agent.oo.scope("batch-3") as batch:
        pending = agent.pending(charge="ch_c", amount=1)
    operator = client_for(users["operator"])
    _, page = preview(operator, action="cancel", scope=batch)
    response = apply(operator, token_of(page), reason="duplicate batch")
    assert "1 applied" in html(response)
    assert agent.state(pending) == "cancelled"
    assert agent.journal(pending)[-1].actor == "operator:operator"


def test_bulk_needs_the_confirmation(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["approver"])
    _, page = preview(client, action="approve", tool="stripe.refund")
    response = post(client, reverse("bulk-apply"), {"token": token_of(page)})
    assert response.status_code == 400
    assert "Tick the box to confirm the bulk action." in html(response)
    assert agent.state(effect_id) == "requires_approval"


def test_bulk_reports_refusals_per_effect(agent: Agent, users) -> None:
    """Two approvers needed: the person who already approved one is refused for it and
    still counted for the other."""
    first = agent.call("wire.transfer", account="A", amount=100)
    second = agent.call("wire.transfer", account="B", amount=200)
    agent.oo.approve(first, by="approver")
    client = client_for(users["approver"])
    _, page = preview(client, action="approve", tool="wire.transfer")
    assert 'data-count="2"' in page

    page = html(apply(client, token_of(page)))
    assert "1 applied, 0 skipped because they changed since they were counted, 1 refused" in page
    assert "approver already approved effect" in page
    assert len(agent.oo.approvals(second)) == 1 and agent.state(second) == "requires_approval"


def test_a_bulk_set_is_sealed_to_its_preview_and_its_person(agent: Agent, users) -> None:
    effect_id = agent.pending()
    _, page = preview(client_for(users["approver"]), action="approve", tool="stripe.refund")
    token = token_of(page)

    response = apply(client_for(users["approver"]), token[:-2] + "xx")
    assert response.status_code == 400
    assert "This preview cannot be verified" in html(response)

    response = apply(client_for(users["approver2"]), token)
    assert response.status_code == 400
    assert "made for someone else" in html(response)
    assert agent.state(effect_id) == "requires_approval"

    # Nor by someone who lacks approve_effect altogether.
    response = apply(client_for(users["operator"]), token)
    assert response.status_code == 400
    assert agent.state(effect_id) == "requires_approval"


def test_bulk_refuses_a_set_larger_than_its_limit(agent: Agent, users, monkeypatch) -> None:
    monkeypatch.setattr(selectors, "BULK_LIMIT", 2)
    for n in range(3):
        agent.pending(charge=f"ch_l{n}", amount=n + 1)
    _, page = preview(client_for(users["approver"]), action="approve", tool="stripe.refund")
    assert "More than 2 effects match this filter" in page
    assert 'name="token"' not in page


def test_bulk_over_htmx_returns_the_results_fragment(agent: Agent, users) -> None:
    effect_id = agent.pending()
    client = client_for(users["approver"])
    _, page = preview(client, action="approve", tool="stripe.refund")
    assert 'hx-post="/effects/bulk/apply/" hx-target="#bulk"' in page
    response = post(
        client,
        reverse("bulk-apply"),
        {"token": token_of(page), "confirm": "on"},
        HTTP_HX_REQUEST="true",
    )
    fragment = html(response)
    assert fragment.lstrip().startswith('<section id="bulk">') and "<html" not in fragment
    assert "1 applied" in fragment and agent.state(effect_id) == "approved"


def test_bulk_preview_needs_the_actions_permission(agent: Agent, users) -> None:
    agent.pending()
    assert preview(client_for(users["operator"]), action="approve")[0].status_code == 403
    assert preview(client_for(users["approver"]), action="cancel")[0].status_code == 403
    response, page = preview(client_for(users["approver"]), action="launch")
    assert response.status_code == 400 and "not one of the available choices" in page
