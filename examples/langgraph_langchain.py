"""LangGraph + LangChain: a support agent on a real StateGraph (a ToolNode, a checkpointer),
driven by a scripted chat model, so it runs offline.

Three tools, two spellings:

* ``send_email`` is a plain LangChain ``@tool`` stacked on ``@oo.effect`` (no adapter):
  its scope is the ``with oo.scope(...)`` around the graph run;
* ``refund`` and ``charge`` use ``effect_tool``: the scope is the graph's ``thread_id``,
  and a call that needs approval pauses the graph with ``interrupt()``.

What happens, all of it recorded in the ledger:

1. the model sends the same email twice (reworded): the second is replayed, not re-sent;
2. the refund needs approval: the graph pauses; eric approves on resume; it runs once;
3. the charge's reply is lost after the provider charged: the effect parks as UNKNOWN and
   the model's retry does not run; eric finds the charge at the provider and resolves it
   as happened; the model's next call replays that receipt.

    python examples/langgraph_langchain.py [ledger.db]
    openonce --db examples-langgraph.db review     # or open it in the console
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command

import openonce_core as openonce
from openonce_core.integrations.langgraph import effect_tool
from openonce_core.testing import ChargeFault, FakePaymentProvider


class ScriptedChatModel(GenericFakeChatModel):
    """A chat model that answers with the next scripted message (no network)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self


def tool_call(name: str, **args: Any) -> AIMessage:
    call_id = "call_" + uuid.uuid4().hex[:8]
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])


EMAIL = {"to": "ada@example.com", "subject": "Your order A-17"}
REFUND = {"charge_id": "ch_0042", "amount_cents": 1999}
CHARGE = {"customer_id": "cus_ada", "order_id": "A-18", "amount_cents": 4500}

SCRIPT = [
    # "Ada was charged twice for A-17: refund the duplicate and tell her."
    tool_call("send_email", **EMAIL, body="We are refunding the duplicate charge."),
    tool_call("send_email", **EMAIL, body="We're refunding the duplicate charge!"),  # retry
    tool_call("refund", **REFUND),
    AIMessage(content="Refunded the duplicate charge and emailed Ada."),
    # "Now charge Ada for her new order A-18."
    tool_call("charge", **CHARGE),
    tool_call("charge", **CHARGE),  # the model retries although it was told not to
    AIMessage(content="The charge is being verified; I will not retry it."),
    # "Did the charge for A-18 go through?"
    tool_call("charge", **CHARGE),
    AIMessage(content="Yes, Ada was charged for A-18."),
]


def main(db: str) -> None:
    oo = openonce.OpenOnce(db, policy=openonce.require_approval_for(["payments.refund"]))
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
    ran: Counter[str] = Counter()

    @tool
    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> dict[str, str]:
        """Email a customer."""
        ran["email.send"] += 1
        return {"message_id": f"<{openonce.current_effect().provider_key}@example.com>"}

    @effect_tool(oo, tool="payments.refund", idempotency_fields=["charge_id"])
    def refund(charge_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund a charge."""
        ran["payments.refund"] += 1
        return {"refund_id": "re_0001", "charge_id": charge_id, "amount_cents": amount_cents}

    @effect_tool(oo, tool="payments.charge", idempotency_fields=["order_id"])
    def charge(customer_id: str, order_id: str, amount_cents: int) -> dict[str, Any]:
        """Charge a customer for an order."""
        ran["payments.charge"] += 1
        # The provider key makes the provider itself dedup a charge that left the process.
        reference = openonce.current_effect().provider_key
        return provider.charge(customer_id, amount_cents, reference).receipt()

    model = ScriptedChatModel(messages=iter(SCRIPT))

    def agent(state: MessagesState) -> dict[str, list[AnyMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([send_email, refund, charge]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())

    thread_id = "support-" + uuid.uuid4().hex[:8]
    config: Any = {"configurable": {"thread_id": thread_id}}
    print(f"thread {thread_id}, ledger {db}")

    def user(text: str) -> dict[str, Any]:
        with oo.scope(thread_id):  # the plain @tool's scope; effect_tool uses the thread
            return graph.invoke({"messages": [("user", text)]}, config)

    # 1 + 2: the duplicate email, then the refund pauses the graph for approval.
    paused = user("Ada was charged twice for A-17: refund the duplicate and tell her.")
    print(
        f"email.send: the model sent the same email twice; handler ran {ran['email.send']}"
        " time: duplicate replayed"
    )
    request = paused["__interrupt__"][0].value
    refund_id = request["effect_id"]
    print(
        f"payments.refund: approval required, the graph is paused ({refund_id});"
        f" handler ran {ran['payments.refund']} times"
    )
    decision = {"effect_id": refund_id, "approved": True, "by": "eric", "reason": "duplicate"}
    with oo.scope(thread_id):
        graph.invoke(Command(resume=decision), config)
    print(
        f"payments.refund: approved by eric on resume; executed once"
        f" (handler ran {ran['payments.refund']} time, state {oo.get(refund_id).state})"
    )

    # 3: the charge's reply is lost after the provider charged.
    result = user("Now charge Ada for her new order A-18.")
    outputs = [json.loads(str(m.content)) for m in result["messages"] if _is_signal(m)]
    unknown = [o for o in outputs if o["status"] == "outcome_unknown"]
    charge_id = unknown[0]["effect_id"]
    print(f"payments.charge: outcome unknown ({charge_id}), parked as {oo.get(charge_id).state}")
    print(
        f"payments.charge: the model retried {len(unknown) - 1} time; not retried"
        f" (handler ran {ran['payments.charge']} time, provider charged"
        f" {len(provider.charges)} time)"
    )
    # A person looks the charge up at the provider by its reference, and commits it.
    (found,) = provider.search(oo.get(charge_id).provider_key).charges
    oo.resolve_happened(
        charge_id, receipt=found.receipt(), by="eric", reason=f"{found.id} found at the provider"
    )
    result = user("Did the charge for A-18 go through?")
    replayed = json.loads(str(result["messages"][-2].content))
    print(
        f"payments.charge: resolved as happened by eric ({found.id}); the model's next call"
        f" replayed {replayed['charge_id']} (handler ran {ran['payments.charge']} time)"
    )
    oo.close()


def _is_signal(message: AnyMessage) -> bool:
    return isinstance(message, ToolMessage) and message.status == "error"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples-langgraph.db")
