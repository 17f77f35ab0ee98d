"""The gateway against what the field sends it: clients racing, cancelling, naming odd
scopes; upstreams answering what the ledger cannot store, dropping a tool after start,
taking arguments named by Python keywords; configurations that give a tool twice. In one
process, as ``test_mcp_gateway.py``: the SDK's client, the gateway's server and an
upstream connected in memory; what the upstream received is counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.server import Server, ServerRequestContext

from openonce_core import ConfigurationError, EffectState
from openonce_core.integrations.mcp import build_server, load_config, open_gateway, parse_config
from tests.mcp.mcp_support import config, tally, until
from tests.mcp.test_mcp_gateway import Setup, run


class Recorder:
    """A low-level upstream server answering whatever a test gives it, and counting the
    calls it received: for answers and schemas ``MCPServer`` would not produce."""

    def __init__(self, tools: list[types.Tool], answer: Any) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

        async def list_tools(
            ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(tools=tools)

        async def call_tool(
            ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
        ) -> types.CallToolResult:
            self.calls.append((params.name, dict(params.arguments or {})))
            return answer(params)

        self.server = Server("recorder", on_list_tools=list_tools, on_call_tool=call_tool)


def run_against(tmp_path: Path, upstream: Recorder, data: dict[str, Any], body: Any) -> None:
    parsed = parse_config(data)
    setup = Setup(tmp_path, data)

    async def main() -> None:
        async with (
            open_gateway(parsed, setup.oo, targets={"payments": upstream.server}) as gateway,
            Client(build_server(gateway)) as client,
        ):
            await body(setup, client)

    try:
        anyio.run(main)
    finally:
        setup.oo.close()


def test_two_sessions_racing_the_same_call_reach_upstream_once(tmp_path, monkeypatch):
    gate = tmp_path / "pay-may-answer"
    monkeypatch.setenv("OO_MCP_PAY_GATE", str(gate))  # the racers arrive while the first runs

    async def body(setup: Setup, first: Client) -> None:
        answers: list[types.CallToolResult] = []
        async with Client(build_server(setup.gateway)) as second:

            async def call(client: Client) -> None:
                answers.append(await client.call_tool("pay", {"order": "o-r", "amount_cents": 9}))

            async with anyio.create_task_group() as group:
                for client in (first, second, first, second):
                    group.start_soon(call, client)
                await until(lambda: tally(setup.counts)["pay"], 10)  # the first is at the provider
                gate.touch()
        assert [a.is_error for a in answers] == [False] * 4
        assert len({json.dumps(a.structured_content) for a in answers}) == 1
        outcomes = sorted((a.meta or {})["openonce/outcome"] for a in answers)
        assert outcomes == ["executed", "replayed", "replayed", "replayed"]
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


def test_a_call_the_client_cancels_mid_flight_settles_and_is_not_sent_again(tmp_path, monkeypatch):
    gate = tmp_path / "pay-may-answer"
    monkeypatch.setenv("OO_MCP_PAY_GATE", str(gate))  # pay answers once the cancel is sent

    async def body(setup: Setup, client: Client) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(client.call_tool, "pay", {"order": "o-c", "amount_cents": 4})
            await until(lambda: tally(setup.counts)["pay"], 10)
            group.cancel_scope.cancel()  # the SDK's client sends notifications/cancelled
        gate.touch()
        again = await client.call_tool("pay", {"order": "o-c", "amount_cents": 4})
        # The upstream's answer still came back to the gateway, and is what the retry gets.
        assert not again.is_error
        assert again.structured_content == {"order": "o-c", "charged": 4, "payment": "pay_o-c"}
        assert (again.meta or {})["openonce/outcome"] == "replayed"
        assert setup.oo.store.count_by_state() == {"committed": 1}
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


@pytest.mark.parametrize(
    ("meta", "says"),
    [
        ({"openonce/scope": 7}, 'scope"] must be a non-empty string of at most 256 characters'),
        ({"openonce/scope": {"run": "a"}}, "not an object"),
        ({"openonce/scope": ""}, "not 0 characters"),
        ({"openonce/scope": "s" * 300}, "not 300 characters"),
        ({"openonce/session": 7}, 'session"] must be a non-empty string'),
    ],
    ids=["number", "object", "empty", "too-long", "session-number"],
)  # fmt: skip
def test_a_scope_in_meta_the_gateway_cannot_use_is_refused_not_widened(tmp_path, meta, says):
    async def body(setup: Setup, client: Client) -> None:
        call = {"order": "o-s", "amount_cents": 1}
        await client.call_tool("pay", call)  # in the configuration's scope
        answer = await client.call_tool("pay", call, meta=meta)
        # Falling back to the configuration's scope would replay the first call's answer
        # to a call the client meant to scope apart.
        assert (answer.structured_content or {})["status"] == "refused"
        assert says in answer.content[0].text  # type: ignore[union-attr]
        assert setup.oo.store.count_by_state() == {"committed": 1}
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


def test_an_argument_named_by_a_python_keyword_is_recorded_and_sent(tmp_path):
    mail = types.Tool(
        name="mail.send/v2",  # dots and a slash: MCP tool names may have them
        input_schema={
            "type": "object",
            "properties": {"to": {"type": "string"}, "from": {"type": "string"}},
            "required": ["to", "from"],
        },
    )
    upstream = Recorder([mail], lambda p: types.CallToolResult(content=[]))
    data = config(tools={"mail.send/v2": {"tool": "mail.send", "idempotency_fields": ["to"]}})

    async def body(setup: Setup, client: Client) -> None:
        call = {"to": "a@example.com", "from": "b@example.com"}
        first = await client.call_tool("mail.send/v2", call)
        await client.call_tool("mail.send/v2", call)
        assert not first.is_error
        effect = setup.oo.get((first.meta or {})["openonce/effect_id"])
        assert effect.args == call
        assert upstream.calls == [("mail.send/v2", call)]

    run_against(tmp_path, upstream, data, body)


def test_a_committed_answer_the_ledger_cannot_store_replays_as_happened(tmp_path):
    pay = types.Tool(name="pay", input_schema={"type": "object", "properties": {}})
    big = {"balance": 10**200}  # JSON, but more digits than the ledger stores

    def answer(params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[], structured_content=big)

    upstream = Recorder([pay], answer)

    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("pay", {})
        again = await client.call_tool("pay", {})
        assert first.structured_content == big  # the first caller gets the answer itself
        effect_id = (first.meta or {})["openonce/effect_id"]
        assert setup.oo.get(effect_id).state == EffectState.COMMITTED
        # Not "outcome unknown, a person will resolve it": nobody has anything to resolve.
        signal = again.structured_content or {}
        assert again.is_error and signal["status"] == "happened"
        assert signal["effect_id"] == effect_id
        assert "Do not call it again" in again.content[0].text  # type: ignore[union-attr]
        assert len(upstream.calls) == 1

    run_against(tmp_path, upstream, config(tools={"pay": {"tool": "payments.pay"}}), body)


def test_a_tool_the_upstream_dropped_after_start_runs_once_it_is_back(tmp_path):
    async def body(setup: Setup, client: Client) -> None:
        pay = setup.upstream._tool_manager.get_tool("pay").fn  # the SDK has no public getter
        setup.upstream.remove_tool("pay")
        gone = await client.call_tool("pay", {"order": "o-d", "amount_cents": 2})
        # The SDK's MCPServer answers "Unknown tool: pay" as a tool error; recorded as
        # FAILED it would be replayed for ever, also once the tool is back.
        assert (gone.structured_content or {})["status"] == "refused"
        assert "no longer lists the tool 'pay'" in gone.content[0].text  # type: ignore[union-attr]
        states = setup.oo.store.count_by_state()
        assert states.get("failed", 0) == 0 and states.get("unknown", 0) == 0
        setup.upstream.add_tool(pay, name="pay")
        back = await client.call_tool("pay", {"order": "o-d", "amount_cents": 2})
        assert not back.is_error and (back.meta or {})["openonce/outcome"] == "executed"
        assert tally(setup.counts)["pay"] == 1

    run(tmp_path, body)


def test_a_tool_listed_twice_in_the_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "openonce-mcp.json"
    path.write_text(
        '{"upstream": {"command": "x"}, "scope": "s", "tools": {\n'
        ' "pay": {"idempotency_fields": ["order"], "secret_fields": ["card"]},\n'
        ' "pay": {"tool": "payments.pay"}}}'
    )
    with pytest.raises(ConfigurationError) as caught:
        load_config(path)  # json alone keeps the second, losing secret_fields silently
    assert str(caught.value).startswith("tools.pay: given twice")


def test_two_tools_with_one_ledger_name_are_refused():
    data = config()
    data["tools"]["refund"] = {"tool": "payments.pay", "idempotency_fields": ["charge"]}
    with pytest.raises(ConfigurationError) as caught:
        parse_config(data)
    assert str(caught.value).startswith("tools.refund.tool: 'payments.pay' is tools.pay's")


def test_a_key_template_reads_an_object_argument_alike_in_any_key_order(tmp_path):
    ship = types.Tool(
        name="ship",
        input_schema={
            "type": "object",
            "properties": {"address": {"type": "object"}, "weight": {"type": "number"}},
        },
    )
    upstream = Recorder([ship], lambda p: types.CallToolResult(content=[]))
    data = config(tools={"ship": {"tool": "parcels.ship", "idempotency_key": "ship-{address}"}})

    async def body(setup: Setup, client: Client) -> None:
        first = await client.call_tool("ship", {"address": {"street": "1 Main", "city": "Oslo"}})
        # The same address, its keys in another order: a model writing the call again.
        again = await client.call_tool("ship", {"address": {"city": "Oslo", "street": "1 Main"}})
        assert (again.meta or {})["openonce/outcome"] == "replayed"
        effect = setup.oo.get((first.meta or {})["openonce/effect_id"])
        assert effect.idempotency_key == 'ship-{"city":"Oslo","street":"1 Main"}'
        assert len(upstream.calls) == 1
        floated = await client.call_tool("ship", {"address": {"lat": 59.9}})
        assert (floated.structured_content or {})["status"] == "refused"
        assert "floats cannot be key material" in floated.content[0].text  # type: ignore[union-attr]
        assert len(upstream.calls) == 1

    run_against(tmp_path, upstream, data, body)
