"""OpenAI Agents SDK: a support agent whose tools are ``effect_function_tool``s, run by the
SDK's real ``Runner`` with a scripted ``Model`` (the SDK's model interface), so it runs
offline. Tracing is off: nothing leaves the machine.

The dedup scope is the conversation (``OpenOnceRunContext(openonce_scope=...)``). When
OpenOnce stops a call, the model gets structured JSON it acts on, and the application
finds the same objects in ``context.openonce_signals``:

1. the model sends the same email twice (reworded): the second is replayed, not re-sent;
2. the refund needs approval: the model is told ``approval_required`` and tells the user;
   the application sees the signal and eric approves; the model calls again with the same
   arguments and the refund runs once;
3. the charge's reply is lost after the provider charged: ``outcome_unknown``, and the
   model's retry (it was told not to) does not run; the reconciler probes the provider,
   finds the charge by its provider key and commits it; the next call replays the receipt.

    python examples/openai_agents_sdk.py [ledger.db]
    openonce --db examples-openai-agents.db review     # or open it in the console
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, Usage, set_tracing_disabled
from agents.items import ModelResponse, TResponseInputItem, TResponseOutputItem
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import openonce_core as openonce
from openonce_core.integrations.openai_agents import OpenOnceRunContext, effect_function_tool
from openonce_core.testing import (
    ChargeFault,
    FakePaymentProber,
    FakePaymentProvider,
    fake_payment_capability,
)


class ScriptedModel(Model):
    """The SDK's model interface, answering each turn with the next scripted output."""

    def __init__(self, turns: list[list[TResponseOutputItem]]) -> None:
        self.turns = turns

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("this example does not stream")


def tool_call(name: str, **args: Any) -> list[TResponseOutputItem]:
    call_id = "call_" + uuid.uuid4().hex[:8]
    arguments = json.dumps(args)
    item = ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=name, arguments=arguments
    )
    return [item]


def reply(text: str) -> list[TResponseOutputItem]:
    content = [ResponseOutputText(text=text, type="output_text", annotations=[], logprobs=[])]
    item = ResponseOutputMessage(
        id="msg_" + uuid.uuid4().hex[:8],
        type="message",
        role="assistant",
        status="completed",
        content=content,
    )
    return [item]


EMAIL = {"to": "ada@example.com", "subject": "Your order A-17"}
REFUND = {"charge_id": "ch_0042", "amount_cents": 1999}
CHARGE = {"customer_id": "cus_ada", "order_id": "A-18", "amount_cents": 4500}

SCRIPT = [
    # "Ada was charged twice for A-17: refund the duplicate and tell her."
    tool_call("send_email", **EMAIL, body="We are refunding the duplicate charge."),
    tool_call("send_email", **EMAIL, body="We're refunding the duplicate charge!"),  # retry
    tool_call("refund", **REFUND),
    reply("The refund is waiting for approval; I will retry it once it is approved."),
    # "It's approved."
    tool_call("refund", **REFUND),
    reply("Refunded the duplicate charge."),
    # "Now charge Ada for her new order A-18."
    tool_call("charge", **CHARGE),
    tool_call("charge", **CHARGE),  # the model retries although it was told not to
    reply("The charge is being verified; I will not retry it."),
    # "Did the charge for A-18 go through?"
    tool_call("charge", **CHARGE),
    reply("Yes, Ada was charged for A-18."),
]


def main(db: str) -> None:
    set_tracing_disabled(True)
    oo = openonce.OpenOnce(db, policy=openonce.require_approval_for(["payments.refund"]))
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
    ran: Counter[str] = Counter()

    @effect_function_tool(oo, tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> str:
        """Email a customer."""
        ran["email.send"] += 1
        return f"sent <{openonce.current_effect().provider_key}@example.com>"

    @effect_function_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    def refund(charge_id: str, amount_cents: int) -> str:
        """Refund a charge."""
        ran["payments.refund"] += 1
        return f"refund re_0001 of {amount_cents} cents on {charge_id}"

    @effect_function_tool(oo, tool="payments.charge", idempotency_fields=["order_id"])
    def charge(customer_id: str, order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge a customer for an order."""
        ran["payments.charge"] += 1
        # The provider key makes the provider itself dedup a charge that left the process.
        reference = openonce.current_effect().provider_key
        return provider.charge(customer_id, amount_cents, reference).receipt()

    agent = Agent(
        name="support",
        instructions="Help customers with their orders.",
        tools=[send_email, refund, charge],
        model=ScriptedModel(SCRIPT),
    )
    conversation_id = "conv-" + uuid.uuid4().hex[:8]
    context = OpenOnceRunContext(openonce_scope=conversation_id)
    history: list[TResponseInputItem] = []
    print(f"conversation {conversation_id}, ledger {db}")

    def user(text: str) -> list[dict[str, Any]]:
        """One user turn; the signals OpenOnce gave the model during it."""
        nonlocal history
        seen = len(context.openonce_signals)
        result = Runner.run_sync(
            agent, [*history, {"role": "user", "content": text}], context=context
        )
        history = result.to_input_list()
        return context.openonce_signals[seen:]

    # 1 + 2: the duplicate email, then the refund waits for approval.
    (pending,) = user("Ada was charged twice for A-17: refund the duplicate and tell her.")
    print(
        f"email.send: the model sent the same email twice; handler ran"
        f" {times(ran['email.send'])}: duplicate replayed"
    )
    print(
        f"payments.refund: approval required ({pending['effect_id']}); the model told the user;"
        f" handler ran {times(ran['payments.refund'])}"
    )
    oo.approve(pending["effect_id"], by="eric", reason="duplicate charge confirmed")
    user("It's approved.")
    print(
        f"payments.refund: approved by eric; the model called again and it executed once"
        f" (handler ran {times(ran['payments.refund'])},"
        f" state {oo.get(pending['effect_id']).state})"
    )

    # 3: the charge's reply is lost after the provider charged.
    signals = user("Now charge Ada for her new order A-18.")
    unknown = [s for s in signals if s["status"] == "outcome_unknown"]
    charge_id = unknown[0]["effect_id"]
    print(f"payments.charge: outcome unknown ({charge_id}), parked as {oo.get(charge_id).state}")
    print(
        f"payments.charge: the model retried {times(len(unknown) - 1)}; not retried"
        f" (handler ran {times(ran['payments.charge'])},"
        f" provider charged {times(len(provider.charges))})"
    )
    reconciler = openonce.Reconciler(
        oo, extra_capabilities=[fake_payment_capability("payments.charge")]
    )
    reconciler.register("payments.charge", FakePaymentProber(provider))
    report = reconciler.reconcile_ids([charge_id])
    reconciler.close()
    receipt = oo.get(charge_id).result
    print(
        f"payments.charge: resolved as happened by the reconciler ({receipt['charge_id']},"
        f" {len(report.committed)} committed)"
    )
    user("Did the charge for A-18 go through?")
    outputs = [
        i for i in history if isinstance(i, dict) and i.get("type") == "function_call_output"
    ]
    print(
        f"payments.charge: the model's next call replayed the receipt {outputs[-1]['output']}"
        f" (handler ran {times(ran['payments.charge'])})"
    )
    oo.close()


def times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples-openai-agents.db")
