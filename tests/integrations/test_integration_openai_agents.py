"""``effect_function_tool`` under the real OpenAI Agents SDK runner, with a scripted
``Model`` (the SDK's model interface; no network, tracing off).

Handlers count their calls; the tool outputs are what the model read on its next turn.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from agents import Agent, RunContextWrapper, Runner, Usage, UserError, set_tracing_disabled
from agents.items import ModelResponse, ToolCallOutputItem, TResponseOutputItem
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from openonce_core import EffectState, OpenOnce, ScopeRequiredError, require_approval_for
from openonce_core.integrations.openai_agents import OpenOnceRunContext, effect_function_tool

set_tracing_disabled(True)


class ScriptedModel(Model):
    """Answers each model turn with the next scripted list of output items."""

    def __init__(self, turns: Iterable[list[TResponseOutputItem]]) -> None:
        self.turns = list(turns)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run the model without streaming")


def call(name: str, args: dict[str, Any], call_id: str | None = None) -> TResponseOutputItem:
    call_id = call_id or f"call_{uuid.uuid4().hex[:8]}"
    return ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=name, arguments=json.dumps(args)
    )


def say(text: str) -> TResponseOutputItem:
    content = [ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])]
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )


def run(tools: list[Any], turns: list[list[TResponseOutputItem]], context: Any) -> list[str]:
    """Run one agent turn-sequence; the tool outputs the model was given, in order."""
    agent = Agent(name="support", instructions="Help.", tools=tools, model=ScriptedModel(turns))
    result = Runner.run_sync(agent, "help me", context=context)
    return [str(i.output) for i in result.new_items if isinstance(i, ToolCallOutputItem)]


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
    @effect_function_tool(oo, tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email.

        Args:
            to: the recipient's address.
            subject: the subject line.
            body: the text.
        """
        ran["email"] += 1
        return f"message {ran['email']} sent to {to}"

    return send_email


@pytest.fixture
def refund(oo, ran):
    @effect_function_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    def refund(charge_id: str, amount_cents: int) -> str:
        """Refund a charge."""
        ran["refund"] += 1
        return f"refund re_{ran['refund']} of {charge_id}"

    return refund


EMAIL = {"to": "ada@example.com", "subject": "Hi", "body": "Hello"}
REFUND = {"charge_id": "ch_1", "amount_cents": 500}


def test_the_tool_schema_is_the_handlers_without_the_context(send_email):
    assert send_email.name == "send_email"
    assert send_email.description == "Send an email."
    schema = send_email.params_json_schema
    assert list(schema["properties"]) == ["to", "subject", "body"]
    assert schema["properties"]["to"]["description"] == "the recipient's address."
    assert schema["required"] == ["to", "subject", "body"]


def test_a_call_the_model_repeats_runs_the_handler_once(oo, ran, send_email):
    reworded = {**EMAIL, "body": "Hello again"}
    context = OpenOnceRunContext(openonce_scope="conv-1")
    outputs = run(
        [send_email],
        [[call("send_email", EMAIL)], [call("send_email", reworded)], [say("sent")]],
        context,
    )

    assert ran["email"] == 1
    assert outputs == ["message 1 sent to ada@example.com"] * 2
    (effect,) = oo.store.list_effects()
    assert (effect.state, effect.scope) == (EffectState.COMMITTED, "conv-1")
    assert context.openonce_signals == []


def test_another_scope_runs_the_call_again(ran, send_email):
    for scope in ("conv-1", "conv-2", "conv-1"):
        turns = [[call("send_email", EMAIL)], [say("sent")]]
        run([send_email], turns, OpenOnceRunContext(openonce_scope=scope))

    assert ran["email"] == 2


def test_dedup_by_call_replays_only_the_same_tool_call(oo, ran):
    @effect_function_tool(oo, tool="notes.add", dedup="call")
    def add_note(text: str) -> str:
        """Add a note to the ticket."""
        ran["email"] += 1
        return f"note {ran['email']}"

    context = OpenOnceRunContext(openonce_scope="conv-1")
    note = {"text": "customer called"}
    # Two model decisions to add the same note: with dedup="call" both are carried out.
    outputs = run(
        [add_note], [[call("add_note", note)], [call("add_note", note)], [say("ok")]], context
    )
    assert outputs == ["note 1", "note 2"]

    # The run restarts and the same decision (the same call id) is executed again: replayed.
    again = [[call("add_note", note, call_id="call_fixed")], [say("ok")]]
    run([add_note], again, context)
    replay = run([add_note], [[call("add_note", note, call_id="call_fixed")], [say("ok")]], context)
    assert ran["email"] == 3
    assert replay == ["note 3"]
    assert {e.scope for e in oo.store.list_effects()} >= {"conv-1/call:call_fixed"}


def test_approval_required_is_an_output_and_the_same_call_after_approval_runs_once(oo, ran, refund):
    context = OpenOnceRunContext(openonce_scope="conv-1")
    outputs = run([refund], [[call("refund", REFUND)], [say("waiting for approval")]], context)

    assert ran["refund"] == 0
    pending = json.loads(outputs[0])
    assert pending["status"] == "approval_required"
    assert pending["tool"] == "payments.refund"
    assert "call this tool again with exactly the same arguments" in pending["instruction"]
    assert context.openonce_signals == [pending]

    oo.approve(pending["effect_id"], by="eric", reason="customer is right")
    turns = [[call("refund", REFUND)], [call("refund", REFUND)], [say("refunded")]]
    after = run([refund], turns, context)

    assert ran["refund"] == 1
    assert after == ["refund re_1 of ch_1"] * 2
    assert oo.get(pending["effect_id"]).state == EffectState.COMMITTED


def test_a_denied_call_tells_the_model_it_will_not_run(oo, ran, refund):
    context = OpenOnceRunContext(openonce_scope="conv-1")
    (pending,) = run([refund], [[call("refund", REFUND)], [say("waiting")]], context)
    oo.deny(json.loads(pending)["effect_id"], by="eric", reason="not eligible")

    (denied,) = run([refund], [[call("refund", REFUND)], [say("denied")]], context)

    assert ran["refund"] == 0
    signal = json.loads(denied)
    assert (signal["status"], signal["by"], signal["reason"]) == (
        "approval_denied",
        "eric",
        "not eligible",
    )


def test_an_unknown_outcome_is_not_retried_when_the_model_retries(oo, ran):
    @effect_function_tool(
        oo, tool="payments.charge", idempotency_key=lambda order_id, **_: f"charge-{order_id}"
    )
    def charge(order_id: str, amount_cents: int) -> str:
        """Charge the customer for an order."""
        ran["charge"] += 1
        raise TimeoutError("read timed out after the charge request was sent")

    order = {"order_id": "o-1", "amount_cents": 2500}
    context = OpenOnceRunContext(openonce_scope="conv-1")
    # The model ignores the instruction and retries, under a new call id.
    turns = [[call("charge", order)], [call("charge", order)], [say("checking")]]
    outputs = run([charge], turns, context)

    assert ran["charge"] == 1
    first, retried = (json.loads(o) for o in outputs)
    assert first["status"] == retried["status"] == "outcome_unknown"
    assert "Do NOT retry" in first["instruction"]
    assert [s["status"] for s in context.openonce_signals] == ["outcome_unknown"] * 2
    effect_id = first["effect_id"]
    assert oo.get(effect_id).state == EffectState.UNKNOWN

    receipt = {"charge_id": "ch_1"}
    oo.resolve_happened(effect_id, receipt=receipt, by="eric", reason="found in the dashboard")
    (later,) = run([charge], [[call("charge", order)], [say("charged")]], context)

    assert ran["charge"] == 1
    assert later == str(receipt)


def test_a_failure_takes_the_sdk_error_path_and_a_retry_replays_it(oo, ran):
    @effect_function_tool(
        oo,
        tool="payments.charge",
        idempotency_fields=["order_id"],
        business_errors=(ValueError,),
        failure_error_function=None,
    )
    def charge(order_id: str) -> str:
        """Charge the customer for an order."""
        ran["charge"] += 1
        raise ValueError("card declined")

    context = OpenOnceRunContext(openonce_scope="conv-1")
    agent_turns = [[call("charge", {"order_id": "o-1"})], [say("declined")]]
    for _ in range(2):
        with pytest.raises(UserError, match="card declined") as raised:
            run([charge], list(agent_turns), context)
        assert isinstance(raised.value.__cause__, ValueError)

    assert ran["charge"] == 1
    (effect,) = oo.store.list_effects()
    assert effect.state == EffectState.FAILED


def test_async_handlers_dedup_and_wait_for_approval(oo, ran):
    @effect_function_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    async def refund(charge_id: str, amount_cents: int) -> str:
        """Refund a charge."""
        await asyncio.sleep(0)
        ran["refund"] += 1
        return f"refunded {charge_id}"

    context = OpenOnceRunContext(openonce_scope="conv-1")
    (pending,) = run([refund], [[call("refund", REFUND)], [say("waiting")]], context)
    oo.approve(json.loads(pending)["effect_id"], by="eric")
    turns = [[call("refund", REFUND)], [call("refund", REFUND)], [say("done")]]
    outputs = run([refund], turns, context)

    assert ran["refund"] == 1
    assert outputs == ["refunded ch_1"] * 2


def test_any_context_with_an_openonce_scope_works(oo, ran, send_email):
    class AppContext:
        openonce_scope = "ticket-42"
        user = "ada"

    run([send_email], [[call("send_email", EMAIL)], [say("sent")]], AppContext())

    assert [e.scope for e in oo.store.list_effects()] == ["ticket-42"]


def test_without_a_scope_the_enclosing_oo_scope_is_used(oo, ran, send_email):
    with oo.scope("outer"):
        run([send_email], [[call("send_email", EMAIL)], [say("sent")]], None)

    assert [e.scope for e in oo.store.list_effects()] == ["outer"]


def test_without_any_scope_a_derived_key_is_refused_and_nothing_runs(oo, ran):
    @effect_function_tool(
        oo, tool="email.send", idempotency_fields=["to"], failure_error_function=None
    )
    def send_email(to: str) -> str:
        """Send an email."""
        ran["email"] += 1
        return "sent"

    with pytest.raises(UserError, match="OpenOnceRunContext") as raised:
        run([send_email], [[call("send_email", {"to": "a@b.c"})], [say("x")]], None)
    assert isinstance(raised.value.__cause__, ScopeRequiredError)
    assert ran["email"] == 0


def test_a_handler_can_read_its_effect_context(oo):
    from openonce_core import current_effect

    seen: list[str] = []

    @effect_function_tool(oo, tool="payments.charge", idempotency_fields=["order_id"])
    def charge(order_id: str) -> str:
        """Charge."""
        seen.append(current_effect().provider_key)
        return "ok"

    run([charge], [[call("charge", {"order_id": "o-1"})], [say("ok")]], OpenOnceRunContext("c"))

    (effect,) = oo.store.list_effects()
    assert seen == [effect.provider_key]


def test_a_handler_taking_the_run_context_is_refused_when_declared(oo):
    with pytest.raises(TypeError, match="takes the run context"):

        @effect_function_tool(oo, tool="x")
        def needs_context(ctx: RunContextWrapper[Any], text: str) -> str:
            """No."""
            return text


def test_importing_the_core_imports_no_framework():
    code = (
        "import sys, openonce_core, openonce_core.integrations\n"
        "print([m for m in ('agents', 'openai', 'langgraph') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
