"""``oo.requested_by(who)``: who an agent makes its calls for (a user, an MCP client and its
session) goes into each new effect's first journal line, in the claim's own commit, on
every store; a duplicate keeps the first requester."""

from __future__ import annotations

import pytest

from openonce_core import ApprovalPending, InvalidArgumentsError, OpenOnce, require_approval_for


def test_the_claim_carries_who_asked_in_its_own_line(store):
    oo = OpenOnce(store)
    runs: list[str] = []

    @oo.effect(tool="email.send", idempotency_key=lambda to: f"welcome-{to}")
    def send(to: str) -> str:
        runs.append(to)
        return "sent"

    with oo.requested_by("user:ann"):
        assert send("a@example.com") == "sent"
    with oo.requested_by("user:bob"):
        assert send("a@example.com") == "sent"  # a duplicate: replayed, nothing written
    assert send("b@example.com") == "sent"  # outside: nobody named
    [first, second] = sorted(oo.store.list_effects(), key=lambda e: e.idempotency_key)
    lines = oo.journal(first.id)
    assert [line.action for line in lines] == ["claim", "finish"]  # no third line
    assert (lines[0].evidence or {}).get("requested_by") == "user:ann"
    assert "requested_by" not in (oo.journal(second.id)[0].evidence or {})
    assert runs == ["a@example.com", "b@example.com"]


def test_a_call_waiting_for_approval_names_who_asked(store):
    oo = OpenOnce(store, policy=require_approval_for("stripe.*"))

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge: f"refund-{charge}")
    def refund(charge: str) -> str:
        return "re_1"

    with oo.requested_by("mcp:claude-code#s-1"), pytest.raises(ApprovalPending) as waiting:
        refund("ch_1")
    [line] = oo.journal(waiting.value.effect_id)
    assert line.action == "request_approval"
    assert line.evidence == {"requested_by": "mcp:claude-code#s-1"}


@pytest.mark.parametrize("who", ["", 7, None, "a\x00b", "x" * 2000])
def test_who_asked_must_be_text_the_ledger_can_hold(who):
    with OpenOnce(":memory:") as oo, pytest.raises((ValueError, InvalidArgumentsError)):
        oo.requested_by(who).__enter__()
