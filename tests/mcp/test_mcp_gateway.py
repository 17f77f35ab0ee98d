"""The MCP gateway in one process: the SDK's client, the gateway's low-level server and a
real upstream MCPServer, connected in memory (no child process, so ``make check`` runs
them). What a user sees: the upstream's own record of the calls it received, the
answers' ``isError``/``structuredContent``, and the ledger's states and journal."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from openonce_core import ConfigurationError, EffectState, OpenOnce
from openonce_core.integrations.mcp import build_server, make_client, open_gateway, parse_config
from tests.mcp.mcp_support import config, received, tally, until
from tests.mcp.mcp_upstream import make_server


class Setup:
    def __init__(self, tmp_path: Path, data: dict[str, Any]) -> None:
        self.counts = tmp_path / "upstream-calls.jsonl"
        self.upstream = make_server(self.counts)
        self.config = parse_config(data)
        self.oo: OpenOnce = make_client(str(tmp_path / "ledger.db"), self.config)
        self.gateway: Any = None  # while a client is connected

    @asynccontextmanager
    async def client(self, name: str = "test-agent") -> AsyncIterator[Client]:
        async with (
            open_gateway(self.config, self.oo, targets={"payments": self.upstream}) as gateway,
            Client(
                build_server(gateway), client_info=types.Implementation(name=name, version="1")
            ) as client,
        ):
            self.gateway = gateway
            yield client


def run(tmp_path: Path, body: Any, data: dict[str, Any] | None = None) -> Setup:
    setup = Setup(tmp_path, data or config())

    async def main() -> None:
        async with setup.client() as client:
            await body(setup, client)

    try:
        anyio.run(main)
    finally:
        setup.oo.close()
    return setup


def test_the_tool_list_passes_through_unchanged(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        async with Client(setup.upstream) as direct:
            upstream = (await direct.list_tools()).tools
        listed = (await client.list_tools()).tools
        assert [t.model_dump() for t in listed] == [t.model_dump() for t in upstream]
        assert {t.name for t in listed} >= {"pay", "refund", "lookup", "decline"}

    run(tmp_path, body)


def test_a_duplicate_replays_without_calling_upstream(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("pay", {"order": "o-1", "amount_cents": 500})
        second = await client.call_tool("pay", {"order": "o-1", "amount_cents": 500})
        assert not first.is_error and not second.is_error
        assert first.structured_content == {"order": "o-1", "charged": 500, "payment": "pay_o-1"}
        assert second.structured_content == first.structured_content
        assert second.content == first.content
        assert (first.meta or {})["openonce/outcome"] == "executed"
        assert (second.meta or {})["openonce/outcome"] == "replayed"
        assert tally(setup.counts)["pay"] == 1
        effect = setup.oo.get((first.meta or {})["openonce/effect_id"])
        assert effect.state == EffectState.COMMITTED
        assert effect.tool == "payments.pay"
        assert effect.args == {"order": "o-1", "amount_cents": 500}

    run(tmp_path, body)


def test_reworded_prose_outside_the_key_still_replays(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        await client.call_tool("pay", {"order": "o-2", "amount_cents": 5, "note": "pay it"})
        again = await client.call_tool("pay", {"order": "o-2", "amount_cents": 5, "note": "pls"})
        assert not again.is_error  # the key is the order alone: the note is prose
        assert (again.meta or {})["openonce/outcome"] == "replayed"
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


def test_pass_through_tools_reach_upstream_every_time_and_are_not_recorded(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        for _ in range(3):
            answer = await client.call_tool("lookup", {"order": "o-1"})
            assert answer.content[0].text == "order o-1: open"  # type: ignore[union-attr]
        assert tally(setup.counts)["lookup"] == 3
        assert sum(setup.oo.store.count_by_state().values()) == 0

    run(tmp_path, body)


def test_an_approval_gated_call_waits_then_runs_once(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        asked = await client.call_tool("refund", {"charge": "ch_1"})
        assert asked.is_error
        signal = asked.structured_content or {}
        effect_id = signal["effect_id"]
        assert signal["status"] == "approval_required"
        text = asked.content[0].text  # type: ignore[union-attr]
        assert "Approval required" in text and effect_id in text
        assert f"https://console.test/effects/{effect_id}/" in text
        assert signal["console"] == f"https://console.test/effects/{effect_id}/"
        again = await client.call_tool("refund", {"charge": "ch_1"})
        assert (again.structured_content or {})["status"] == "approval_required"
        assert tally(setup.counts)["refund"] == 0

        setup.oo.approve(effect_id, by="eric", reason="checked")
        ran = await client.call_tool("refund", {"charge": "ch_1"})
        assert not ran.is_error
        assert (ran.meta or {})["openonce/effect_id"] == effect_id
        replayed = await client.call_tool("refund", {"charge": "ch_1"})
        assert replayed.structured_content == ran.structured_content
        assert tally(setup.counts)["refund"] == 1

    run(tmp_path, body)


def test_the_provider_key_reaches_upstream_in_meta_and_as_the_named_argument(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        setup.oo.policy = lambda tool, args: __import__("openonce_core").PolicyDecision()
        answer = await client.call_tool("refund", {"charge": "ch_2"})
        effect = setup.oo.get((answer.meta or {})["openonce/effect_id"])
        (line,) = [r for r in received(setup.counts) if r["tool"] == "refund"]
        assert line["provider_key"] == effect.provider_key
        assert line["args"]["idempotency_key"] == effect.provider_key
        assert effect.args == {"charge": "ch_2"}  # what OpenOnce adds is not the call's
        assert effect.idempotency_key == "refund-ch_2"

    run(tmp_path, body)


def test_an_upstream_tool_error_is_failed_and_replays(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("decline", {"order": "o-3"})
        second = await client.call_tool("decline", {"order": "o-3"})
        assert first.is_error and second.is_error
        assert "card declined for o-3" in first.content[0].text  # type: ignore[union-attr]
        assert second.content == first.content
        assert (second.meta or {})["openonce/outcome"] == "replayed"
        assert tally(setup.counts)["decline"] == 1
        effect = setup.oo.get((first.meta or {})["openonce/effect_id"])
        assert effect.state == EffectState.FAILED

    run(tmp_path, body)


def test_an_upstream_error_outside_business_errors_is_unknown(tmp_path):
    data = config()
    data["tools"]["decline"]["business_errors"] = ["insufficient funds"]

    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("decline", {"order": "o-4"})
        second = await client.call_tool("decline", {"order": "o-4"})
        for answer in (first, second):
            assert answer.is_error
            assert (answer.structured_content or {})["status"] == "outcome_unknown"
            assert "Do not retry" in answer.content[0].text  # type: ignore[union-attr]
        assert tally(setup.counts)["decline"] == 1

    run(tmp_path, body, data)


def test_a_timeout_is_unknown_and_never_sent_upstream_again(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("hang", {"order": "o-5"})
        signal = first.structured_content or {}
        assert first.is_error and signal["status"] == "outcome_unknown"
        assert "Do not retry" in first.content[0].text  # type: ignore[union-attr]
        again = await client.call_tool("hang", {"order": "o-5"})
        assert (again.structured_content or {})["status"] == "outcome_unknown"
        assert (again.structured_content or {})["effect_id"] == signal["effect_id"]
        assert tally(setup.counts)["hang"] == 1
        assert setup.oo.get(signal["effect_id"]).state == EffectState.UNKNOWN

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("pay", {"amount_cents": 5}, "'order' is missing"),
        ("refund", {}, "'charge' is missing: it is part of this call's idempotency key"),
        ("convert", {"order": "o-1", "rate": 1.5}, "floats cannot be key material"),
        ("pay", {"order": "o\x00", "amount_cents": 5}, "NUL"),
        ("pay", {"order": "o-1", "amount_cents": 10**101}, "more than 100 digits"),
        ("pay", {"order": "o-1", "amount_cents": "5"}, "is not of type 'integer'"),
    ],
    ids=[
        "missing-key-field",
        "missing-key-template-field",
        "float-key",
        "nul",
        "huge-integer",
        "not-in-schema",
    ],
)
def test_a_bad_call_is_refused_and_nothing_runs(tmp_path, tool, arguments, says):
    async def body(setup: Setup, client: Client) -> None:
        answer = await client.call_tool(tool, arguments)
        assert answer.is_error
        assert (answer.structured_content or {})["status"] == "refused"
        assert says in answer.content[0].text  # type: ignore[union-attr]
        assert "nothing ran" in answer.content[0].text  # type: ignore[union-attr]
        assert received(setup.counts) == []
        assert sum(setup.oo.store.count_by_state().values()) == 0

    run(tmp_path, body)


def test_scope_comes_from_the_call_meta_then_the_config(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        call = {"order": "o-6", "amount_cents": 1}
        await client.call_tool("pay", call)
        await client.call_tool("pay", call, meta={"openonce/scope": "run-a"})
        await client.call_tool("pay", call, meta={"openonce/scope": "run-a"})
        await client.call_tool("pay", call, meta={"openonce/scope": "run-b"})
        assert tally(setup.counts)["pay"] == 3  # config scope, run-a, run-b

    run(tmp_path, body)


def test_without_any_scope_a_derived_key_is_refused(tmp_path):
    data = config()
    del data["scope"]

    async def body(setup: Setup, client: Client) -> None:
        answer = await client.call_tool("pay", {"order": "o-7", "amount_cents": 1})
        assert (answer.structured_content or {})["status"] == "refused"
        assert "openonce/scope" in answer.content[0].text  # type: ignore[union-attr]
        assert received(setup.counts) == []

    run(tmp_path, body, data)


def test_a_session_scope_dedupes_within_a_session_only(tmp_path):
    data = config(scope={"per": "session"})

    async def body(setup: Setup, client: Client) -> None:
        call = {"order": "o-8", "amount_cents": 1}
        for session in ("s-1", "s-1", "s-2"):
            await client.call_tool("pay", call, meta={"openonce/session": session})
        assert tally(setup.counts)["pay"] == 2

    run(tmp_path, body, data)


def test_the_requester_is_journaled_with_the_effect(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        answer = await client.call_tool(
            "pay", {"order": "o-9", "amount_cents": 1}, meta={"openonce/session": "sess-9"}
        )
        journal = setup.oo.journal((answer.meta or {})["openonce/effect_id"])
        # In the claim's own line and commit: no third commit on the call's path.
        assert [line.action for line in journal] == ["claim", "finish"]
        assert (journal[0].evidence or {}).get("requested_by") == "mcp:test-agent#sess-9"

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tools": {"pay": {"idempotency_fields": "order"}}}, "tools.pay.idempotency_fields"),
        ({"tools": {"pay": {"max_attemps": 2}}}, "tools.pay.max_attemps"),
        ({"scope": 7}, "scope"),
        ({"policy": {"require_approval_for": "payments.*"}}, "policy.require_approval_for"),
        ({"upstream": {"p": {"command": "x", "url": "http://h"}}}, "upstream.p"),
        ({"tools": {"pay": {"idempotency_key": "k", "idempotency_fields": ["order"]}}},
         "tools.pay"),
        ({"upstream": {"p": {"url": "ftp://h"}}}, "upstream.p.url"),
        ({"extra": 1}, "extra"),
    ],
    ids=["fields-not-list", "unknown-tool-key", "scope-type", "patterns-not-list",
         "command-and-url", "key-and-fields", "url-scheme", "unknown-top-key"],
)  # fmt: skip
def test_a_bad_config_names_the_field(change, field):
    data = config()
    data.update(change)
    with pytest.raises(ConfigurationError) as caught:
        parse_config(data)
    assert str(caught.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("tools", "field", "says"),
    [
        ({"charge_card": {}}, "tools.charge_card", "no upstream lists a tool named"),
        ({"pay": {"idempotency_fields": ["ordr"]}}, "tools.pay.idempotency_fields[0]",
         "'ordr' is not an argument of 'pay'"),
        ({"pay": {"idempotency_key": "k-{id}"}}, "tools.pay.idempotency_key", "{id}"),
    ],
    ids=["unknown-upstream-tool", "unknown-field", "unknown-template-field"],
)  # fmt: skip
def test_a_config_that_does_not_fit_the_upstream_starts_nothing(tmp_path, tools, field, says):
    setup = Setup(tmp_path, config(tools=tools))

    async def main() -> None:
        async with setup.client():
            raise AssertionError("the gateway started")

    with pytest.raises(ConfigurationError) as caught:
        try:
            anyio.run(main)
        finally:
            setup.oo.close()
    assert str(caught.value).startswith(f"{field}: ") and says in str(caught.value)
    assert received(setup.counts) == []


def test_the_person_asked_to_approve_sees_who_asked_once(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        meta = {"openonce/session": "sess-7"}
        asked = await client.call_tool("refund", {"charge": "ch_7"}, meta=meta)
        await client.call_tool("refund", {"charge": "ch_7"}, meta=meta)
        effect_id = (asked.structured_content or {})["effect_id"]
        journal = setup.oo.journal(effect_id)
        assert (journal[0].evidence or {}).get("requested_by") == "mcp:test-agent#sess-7"
        assert [line for line in journal if line.action == "note"] == []  # asked once
        # Another session asking for the same effect is noted for the approver.
        await client.call_tool("refund", {"charge": "ch_7"}, meta={"openonce/session": "s-8"})
        notes = [line.actor for line in setup.oo.journal(effect_id) if line.action == "note"]
        assert notes == ["mcp:test-agent#s-8"]

    run(tmp_path, body)


def test_arguments_that_do_not_fit_the_schema_are_refused_not_recorded(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        wrong = await client.call_tool("pay", {"order": "o-11", "amount_cents": "five"})
        assert (wrong.structured_content or {})["status"] == "refused"
        assert "['amount_cents']" in wrong.content[0].text  # type: ignore[union-attr]
        assert sum(setup.oo.store.count_by_state().values()) == 0
        fixed = await client.call_tool("pay", {"order": "o-11", "amount_cents": 5})
        assert not fixed.is_error  # the corrected call runs: no failure was recorded
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


def test_secret_fields_without_a_pepper_stop_the_gateway_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENONCE_SECRET_PEPPER", raising=False)
    data = config()
    data["tools"]["pay"]["secret_fields"] = ["note"]
    setup = Setup(tmp_path, data)

    async def main() -> None:
        async with setup.client():
            raise AssertionError("the gateway started")

    with pytest.raises(ConfigurationError, match=r"^tools\.pay: secret_fields need a pepper"):
        try:
            anyio.run(main)
        finally:
            setup.oo.close()


def test_secret_fields_are_stored_as_digests_and_still_dedupe(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENONCE_SECRET_PEPPER", "p" * 32)
    data = config()
    data["tools"]["pay"]["secret_fields"] = ["note"]

    async def body(setup: Setup, client: Client) -> None:
        call = {"order": "o-12", "amount_cents": 3, "note": "card 4242424242424242"}
        first = await client.call_tool("pay", call)
        await client.call_tool("pay", call)
        effect = setup.oo.get((first.meta or {})["openonce/effect_id"])
        assert "4242424242424242" not in str(effect.args)
        assert received(setup.counts)[0]["args"]["note"] == call["note"]  # sent in clear
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body, data)


def test_while_the_upstream_is_lost_a_call_sends_nothing_and_records_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("openonce_core._mcp_gateway.RECONNECT_PAUSE", 3600.0)

    async def body(setup: Setup, client: Client) -> None:
        gateway_upstream = setup.gateway.routes["pay"]
        gateway_upstream.broke()  # as a connection closing under a call does
        await until(lambda: gateway_upstream.client is None, 10)
        answer = await client.call_tool("pay", {"order": "o-13", "amount_cents": 1})
        assert (answer.structured_content or {})["status"] == "refused"
        assert "not connected" in answer.content[0].text  # type: ignore[union-attr]
        lookup = await client.call_tool("lookup", {"order": "o-13"})
        assert lookup.is_error and "not connected" in lookup.content[0].text  # type: ignore[union-attr]
        assert received(setup.counts) == []
        states = setup.oo.store.count_by_state()
        assert states.get("committed", 0) == 0 and states.get("unknown", 0) == 0

    run(tmp_path, body)


def test_an_unknown_call_a_person_resolves_replays_the_receipt(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        lost = await client.call_tool("hang", {"order": "o-14"})
        effect_id = (lost.structured_content or {})["effect_id"]
        setup.oo.resolve_happened(
            effect_id, receipt={"payment": "pay_o-14"}, by="eric", reason="in the dashboard"
        )
        answer = await client.call_tool("hang", {"order": "o-14"})
        # hang's output schema is {"result": string}: the receipt is not such an answer,
        # so it is told as what it is, the call happened, with the receipt.
        assert answer.is_error
        signal = answer.structured_content or {}
        assert signal["status"] == "happened"
        assert signal["receipt"] == {"payment": "pay_o-14"}
        assert "Do not call it again" in signal["instruction"]
        assert (answer.meta or {})["openonce/outcome"] == "replayed"
        assert tally(setup.counts)["hang"] == 1

    run(tmp_path, body)
