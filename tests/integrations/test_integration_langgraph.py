"""``effect_tool`` inside real LangGraph graphs: a StateGraph with a ToolNode, an
InMemorySaver checkpointer, and a scripted chat model (no network).

Handlers count their calls, so "ran once" through interrupts, resumes, model retries and
re-run steps is a number; the tool messages are what the model read.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

from openonce_core import (
    EffectState,
    OpenOnce,
    PolicyDecision,
    require_approval_for,
)
from openonce_core.integrations.langgraph import effect_tool


class ScriptedChatModel(GenericFakeChatModel):
    """Answers with the next scripted message; tool binding is a no-op."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self


def calls(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    return AIMessage(
        content="",
        tool_calls=[
            {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:8]}", "type": "tool_call"}
            for name, args in calls
        ],
    )


def say(text: str) -> AIMessage:
    return AIMessage(content=text)


def agent_graph(tools: list[BaseTool], script: Iterable[AIMessage], *, checkpointer: bool = True):
    model = ScriptedChatModel(messages=iter(script))

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def agent_async(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    any_async = any(t.coroutine is not None for t in tools if hasattr(t, "coroutine"))
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent_async if any_async else agent)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver() if checkpointer else None)


def thread(thread_id: str = "thread-1") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def signal(message: ToolMessage) -> dict[str, Any]:
    assert message.status == "error"
    return json.loads(str(message.content))


@pytest.fixture
def oo():
    ledger = OpenOnce(":memory:", retry_delay=0, policy=require_approval_for(["payments.refund"]))
    yield ledger
    ledger.close()


@pytest.fixture
def ran() -> dict[str, int]:
    return {"email": 0, "refund": 0, "charge": 0}


@pytest.fixture
def send_email(oo, ran):
    @effect_tool(oo, tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> dict:
        """Send an email."""
        ran["email"] += 1
        return {"message_id": f"<{ran['email']}@example.com>"}

    return send_email


@pytest.fixture
def refund(oo, ran):
    @effect_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    def refund(charge_id: str, amount_cents: int) -> dict:
        """Refund a charge."""
        ran["refund"] += 1
        return {"refund_id": f"re_{ran['refund']}", "charge_id": charge_id}

    return refund


REFUND = ("refund", {"charge_id": "ch_1", "amount_cents": 500})


def test_a_call_the_model_repeats_in_a_thread_runs_the_handler_once(oo, ran, send_email):
    graph = agent_graph(
        [send_email],
        [
            calls(("send_email", {"to": "ada@example.com", "subject": "Hi", "body": "Hello"})),
            # The model retries with reworded prose: same intent, replayed.
            calls(("send_email", {"to": "ada@example.com", "subject": "Hi", "body": "Hello!"})),
            say("sent"),
        ],
    )
    result = graph.invoke({"messages": [("user", "email ada")]}, thread("thread-1"))

    assert ran["email"] == 1
    first, second = tool_messages(result)
    assert first.content == second.content == '{"message_id": "<1@example.com>"}'
    (effect,) = oo.store.list_effects()
    assert (effect.state, effect.scope, effect.attempt) == (EffectState.COMMITTED, "thread-1", 1)


def test_the_scope_is_the_thread_so_another_thread_runs_the_call_again(oo, ran, send_email):
    args = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}
    for thread_id in ("thread-a", "thread-b", "thread-a"):
        graph = agent_graph([send_email], [calls(("send_email", args)), say("sent")])
        graph.invoke({"messages": [("user", "email ada")]}, thread(thread_id))

    assert ran["email"] == 2
    assert sorted(e.scope or "" for e in oo.store.list_effects()) == ["thread-a", "thread-b"]


def test_approval_interrupts_the_graph_and_the_resumed_call_runs_once(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), calls(REFUND), say("refunded")])
    config = thread()

    paused = graph.invoke({"messages": [("user", "refund ch_1")]}, config)

    assert ran["refund"] == 0
    (interrupt,) = paused["__interrupt__"]
    request = interrupt.value
    assert request["openonce"] == "approval_required"
    assert request["tool"] == "payments.refund"
    assert request["args"] == {"charge_id": "ch_1", "amount_cents": 500}
    assert (request["approvals"], request["required"]) == (0, 1)
    effect_id = request["effect_id"]
    assert oo.get(effect_id).state == EffectState.REQUIRES_APPROVAL

    decision = {"effect_id": effect_id, "approved": True, "by": "eric", "reason": "ok"}
    result = graph.invoke(Command(resume=decision), config)

    # LangGraph re-ran the tools node from its start; the handler ran once, and the model's
    # later identical call replayed the receipt.
    assert ran["refund"] == 1
    assert "__interrupt__" not in result
    first, second = tool_messages(result)
    assert json.loads(str(first.content)) == {"refund_id": "re_1", "charge_id": "ch_1"}
    assert second.content == first.content
    assert oo.get(effect_id).state == EffectState.COMMITTED
    assert [(a.decision, a.by) for a in oo.approvals(effect_id)] == [("approve", "eric")]
    assert "operator:eric" in [line.actor for line in oo.journal(effect_id)]


def test_a_decision_without_an_effect_id_applies_to_the_pending_interrupt(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("refunded")])
    config = thread()
    graph.invoke({"messages": [("user", "refund ch_1")]}, config)

    graph.invoke(Command(resume={"approved": True, "by": "eric"}), config)

    assert ran["refund"] == 1


def test_a_denial_on_resume_becomes_a_message_and_the_handler_never_runs(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("it was denied")])
    config = thread()
    paused = graph.invoke({"messages": [("user", "refund ch_1")]}, config)
    effect_id = paused["__interrupt__"][0].value["effect_id"]

    decision = {"effect_id": effect_id, "approved": False, "by": "eric", "reason": "fraud"}
    result = graph.invoke(Command(resume=decision), config)

    assert ran["refund"] == 0
    (message,) = tool_messages(result)
    denied = signal(message)
    assert denied["status"] == "approval_denied"
    assert (denied["effect_id"], denied["by"], denied["reason"]) == (effect_id, "eric", "fraud")
    assert oo.get(effect_id).state == EffectState.DENIED


def test_an_approval_given_elsewhere_is_read_from_the_ledger_on_resume(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("refunded")])
    config = thread()
    paused = graph.invoke({"messages": [("user", "refund ch_1")]}, config)
    oo.approve(paused["__interrupt__"][0].value["effect_id"], by="eric")  # the console

    graph.invoke(Command(resume=True), config)

    assert ran["refund"] == 1


def test_resuming_without_a_decision_asks_again(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("refunded")])
    config = thread()
    first = graph.invoke({"messages": [("user", "refund ch_1")]}, config)

    again = graph.invoke(Command(resume=True), config)

    assert ran["refund"] == 0
    assert (
        again["__interrupt__"][0].value["effect_id"] == first["__interrupt__"][0].value["effect_id"]
    )


def test_a_decision_naming_another_effect_is_never_applied(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("refunded")])
    config = thread()
    paused = graph.invoke({"messages": [("user", "refund ch_1")]}, config)
    effect_id = paused["__interrupt__"][0].value["effect_id"]

    stray = {"effect_id": "eff_someone_else", "approved": True, "by": "eric"}
    again = graph.invoke(Command(resume=stray), config)

    assert ran["refund"] == 0
    assert again["__interrupt__"][0].value["effect_id"] == effect_id
    assert oo.approvals(effect_id) == []
    graph.invoke(Command(resume={"effect_id": effect_id, "approved": True, "by": "eric"}), config)
    assert ran["refund"] == 1


def test_two_approvers_are_two_interrupts_and_one_execution(ran):
    two = require_approval_for(["payments.refund"], approvers=2)
    with OpenOnce(":memory:", retry_delay=0, policy=two) as oo:

        @effect_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
        def refund(charge_id: str, amount_cents: int) -> dict:
            """Refund a charge."""
            ran["refund"] += 1
            return {"refund_id": "re_1"}

        graph = agent_graph([refund], [calls(REFUND), say("refunded")])
        config = thread()
        paused = graph.invoke({"messages": [("user", "refund ch_1")]}, config)
        effect_id = paused["__interrupt__"][0].value["effect_id"]

        second = graph.invoke(Command(resume={"approved": True, "by": "eric"}), config)
        assert ran["refund"] == 0
        assert second["__interrupt__"][0].value["approvals"] == 1

        graph.invoke(Command(resume={"approved": True, "by": "ana"}), config)
        assert ran["refund"] == 1
        assert sorted(a.by for a in oo.approvals(effect_id)) == ["ana", "eric"]


def test_parallel_approvals_each_decision_reaches_only_the_effect_it_names(oo, ran, refund):
    two_refunds = calls(
        ("refund", {"charge_id": "ch_a", "amount_cents": 100}),
        ("refund", {"charge_id": "ch_b", "amount_cents": 200}),
    )
    graph = agent_graph([refund], [two_refunds, say("refunded")])
    config = thread()
    graph.invoke({"messages": [("user", "refund both")]}, config)
    approver = {"ch_a": "ana", "ch_b": "bob"}

    for _ in range(6):  # LangGraph surfaces one interrupt of the step at a time
        pending = graph.get_state(config).interrupts
        if not pending:
            break
        resume = {
            i.id: {
                "effect_id": i.value["effect_id"],
                "approved": True,
                "by": approver[i.value["args"]["charge_id"]],
            }
            for i in pending
        }
        graph.invoke(Command(resume=resume), config)

    assert ran["refund"] == 2
    for effect in oo.store.list_effects():
        assert effect.state == EffectState.COMMITTED
        assert [a.by for a in oo.approvals(effect.id)] == [approver[effect.args["charge_id"]]]


def test_an_unknown_outcome_tells_the_model_not_to_retry_and_a_retry_does_not_run(oo, ran):
    @effect_tool(oo, tool="payments.charge", idempotency_fields=["order_id"])
    def charge(order_id: str, amount_cents: int) -> dict:
        """Charge a customer for an order."""
        ran["charge"] += 1
        if ran["charge"] == 1:
            raise TimeoutError("read timed out after the request was sent")
        return {"charge_id": "ch_new"}

    order = ("charge", {"order_id": "o-1", "amount_cents": 2500})
    graph = agent_graph([charge], [calls(order), calls(order), say("checking")])
    config = thread()
    result = graph.invoke({"messages": [("user", "charge o-1")]}, config)

    assert ran["charge"] == 1
    first, retried = (signal(m) for m in tool_messages(result))
    assert first["status"] == retried["status"] == "outcome_unknown"
    assert "Do NOT retry" in first["instruction"]
    effect_id = first["effect_id"]
    assert oo.get(effect_id).state == EffectState.UNKNOWN

    oo.resolve_happened(effect_id, receipt={"charge_id": "ch_1"}, by="eric", reason="found it")
    graph = agent_graph([charge], [calls(order), say("charged")])
    later = graph.invoke({"messages": [("user", "did it go through?")]}, config)

    assert ran["charge"] == 1
    assert json.loads(str(tool_messages(later)[-1].content)) == {"charge_id": "ch_1"}


def test_a_step_that_failed_is_re_run_and_replays_the_effect_it_had_run(oo, ran, send_email):
    crashes = {"left": 1}

    @tool
    def lookup_order(order_id: str) -> str:
        """Look up an order."""
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("the worker died mid-step")
        return "order o-1: paid"

    step = calls(
        ("send_email", {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}),
        ("lookup_order", {"order_id": "o-1"}),
    )
    graph = agent_graph([send_email, lookup_order], [step, say("done")])
    config = thread()
    with pytest.raises(RuntimeError, match="worker died"):
        graph.invoke({"messages": [("user", "email ada")]}, config)
    assert ran["email"] == 1

    result = graph.invoke(None, config)  # re-run the failed step from its checkpoint

    assert ran["email"] == 1
    emailed = tool_messages(result)[0]
    assert emailed.content == '{"message_id": "<1@example.com>"}'


def test_async_handlers_interrupt_and_resume_once(oo, ran):
    @effect_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    async def refund(charge_id: str, amount_cents: int) -> dict:
        """Refund a charge."""
        await asyncio.sleep(0)
        ran["refund"] += 1
        return {"refund_id": "re_1"}

    graph = agent_graph([refund], [calls(REFUND), calls(REFUND), say("refunded")])
    config = thread()

    async def run() -> dict[str, Any]:
        await graph.ainvoke({"messages": [("user", "refund ch_1")]}, config)
        return await graph.ainvoke(Command(resume={"approved": True, "by": "eric"}), config)

    result = asyncio.run(run())

    assert ran["refund"] == 1
    assert [json.loads(str(m.content)) for m in tool_messages(result)] == [
        {"refund_id": "re_1"},
        {"refund_id": "re_1"},
    ]


def test_a_plain_tool_stacked_on_an_effect_uses_the_enclosing_scope(oo, ran):
    @tool
    @oo.effect(tool="email.send", idempotency_fields=["to"])
    def send_email(to: str, body: str) -> str:
        """Send an email."""
        ran["email"] += 1
        return f"sent to {to}"

    args = {"to": "ada@example.com", "body": "Hello"}
    script = [calls(("send_email", args)), calls(("send_email", args)), say("sent")]
    graph = agent_graph([send_email], script)
    with oo.scope("conversation-7"):
        graph.invoke({"messages": [("user", "email ada")]}, thread())

    assert ran["email"] == 1
    assert [e.scope for e in oo.store.list_effects()] == ["conversation-7"]


def test_without_a_checkpointer_an_approval_is_a_message(oo, ran, refund):
    graph = agent_graph([refund], [calls(REFUND), say("waiting")], checkpointer=False)
    with oo.scope("run-1"):
        result = graph.invoke({"messages": [("user", "refund ch_1")]})

    assert ran["refund"] == 0
    (message,) = tool_messages(result)
    assert signal(message)["status"] == "approval_required"


def test_the_tool_is_named_for_the_model_and_the_effect_for_the_ledger(oo, refund):
    assert refund.name == "refund"
    assert refund.description == "Refund a charge."
    assert set(refund.args) == {"charge_id", "amount_cents"}
    assert refund.metadata == {"openonce_tool": "payments.refund"}


def test_a_policy_reads_the_arguments_the_tool_was_called_with(ran):
    def big_refunds(tool: str, args: Any) -> PolicyDecision:
        return PolicyDecision(requires_approval=args.get("amount_cents", 0) > 1000)

    with OpenOnce(":memory:", retry_delay=0, policy=big_refunds) as oo:

        @effect_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
        def refund(charge_id: str, amount_cents: int) -> dict:
            """Refund a charge."""
            ran["refund"] += 1
            return {"refund_id": charge_id}

        small = ("refund", {"charge_id": "ch_1", "amount_cents": 500})
        big = ("refund", {"charge_id": "ch_2", "amount_cents": 5000})
        graph = agent_graph([refund], [calls(small), calls(big), say("done")])
        paused = graph.invoke({"messages": [("user", "refunds")]}, thread())

        assert ran["refund"] == 1
        assert paused["__interrupt__"][0].value["args"]["charge_id"] == "ch_2"


def test_importing_the_core_imports_no_framework():
    code = (
        "import sys, openonce_core, openonce_core.integrations\n"
        "loaded = [m for m in ('langgraph', 'langchain_core', 'agents', 'openai', 'anthropic')"
        " if m in sys.modules]\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
