"""Both integrations take a literal ``idempotency_key``, as ``oo.effect`` does: the key is
global, so calls in other threads or conversations replay the first one, and the same key
with other arguments is refused."""

from __future__ import annotations

import asyncio
import json

import pytest

from openonce_core import EffectState, IdempotencyMismatchError, OpenOnce


@pytest.fixture
def oo():
    ledger = OpenOnce(":memory:", retry_delay=0)
    yield ledger
    ledger.close()


def test_langgraph_tool_with_a_literal_key_runs_once_in_any_thread(oo):
    pytest.importorskip("langgraph")
    from openonce_core.integrations.langgraph import effect_tool

    ran: list[str] = []

    @effect_tool(oo, tool="payments.refund", idempotency_key="refund-ch_1")
    def refund(charge: str) -> str:
        """Refund a charge."""
        ran.append(charge)
        return f"re_{len(ran)}"

    results = [
        refund.invoke({"charge": "ch_1"}, config={"configurable": {"thread_id": thread}})
        for thread in ("thread-a", "thread-b")
    ]

    assert (results, ran) == (["re_1", "re_1"], ["ch_1"])
    (effect,) = oo.store.list_effects()
    assert (effect.idempotency_key, effect.state) == ("refund-ch_1", EffectState.COMMITTED)
    with pytest.raises(IdempotencyMismatchError, match="already used with different arguments"):
        refund.invoke({"charge": "ch_2"})
    assert ran == ["ch_1"]


def test_openai_agents_tool_with_a_literal_key_runs_once_in_any_conversation(oo):
    pytest.importorskip("agents")
    from agents.tool_context import ToolContext

    from openonce_core.integrations.openai_agents import OpenOnceRunContext, effect_function_tool

    ran: list[str] = []

    @effect_function_tool(oo, tool="payments.refund", idempotency_key="refund-ch_1")
    def refund(charge: str) -> str:
        """Refund a charge."""
        ran.append(charge)
        return f"re_{len(ran)}"

    def invoke(context: object, charge: str) -> object:
        arguments = json.dumps({"charge": charge})
        ctx = ToolContext(context, tool_name="refund", tool_call_id="c1", tool_arguments=arguments)
        return asyncio.run(refund.on_invoke_tool(ctx, arguments))

    # No scope at all is fine: a literal key needs none.
    results = [
        invoke(OpenOnceRunContext(openonce_scope="conv-1"), "ch_1"),
        invoke(OpenOnceRunContext(), "ch_1"),
    ]

    assert (results, ran) == (["re_1", "re_1"], ["ch_1"])
    (effect,) = oo.store.list_effects()
    assert (effect.idempotency_key, effect.state) == ("refund-ch_1", EffectState.COMMITTED)
