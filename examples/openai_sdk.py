"""The bare OpenAI SDK: a hand-written chat-completions tool loop. No adapter: you execute
the tool calls, so ``@oo.effect`` on each handler is the whole integration.

The SDK is real (``openai.OpenAI``, its request building and response parsing); only its
HTTP transport is a scripted fake (``httpx2.MockTransport``), so nothing leaves the machine.

Where the scope comes from, in a loop you own:

* ``with oo.scope(f"{conversation}/{tool_call.id}")`` around each call: re-executing the
  very same tool call — a loop that crashed after running it and before recording the
  answer, then restarted — replays it;
* money-moving tools take an explicit ``idempotency_key`` from business ids (the charge,
  the order), so every call about the same charge, whichever model decision or process
  makes it, is one effect.

What happens:

1. the loop crashes after sending an email, before saving the answer; on restart it
   answers the pending tool call again: replayed, not re-sent;
2. the refund needs approval: the model is told, eric approves, the model calls again and
   the refund runs once;
3. the charge's reply is lost after the provider charged: UNKNOWN, and the model's retry
   does not run; eric finds the charge at the provider and resolves it as happened; the
   next call replays that receipt.

    python examples/openai_sdk.py [ledger.db]
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from typing import Any

import httpx2
import openai

import openonce_core as openonce
from openonce_core.testing import ChargeFault, FakePaymentProvider

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t} for p, t in params.items()},
                "required": list(params),
            },
        },
    }
    for name, description, params in [
        (
            "send_email",
            "Email a customer.",
            {"to": "string", "subject": "string", "body": "string"},
        ),
        ("refund", "Refund a charge.", {"charge_id": "string", "amount_cents": "integer"}),
        (
            "charge",
            "Charge a customer for an order.",
            {"customer_id": "string", "order_id": "string", "amount_cents": "integer"},
        ),
    ]
]


class ScriptedChatCompletions:
    """The HTTP side of a chat model: answers each ``POST /chat/completions`` with the next
    scripted assistant message, and refuses a request that leaves a tool call unanswered,
    as the real API does."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = script

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        messages = json.loads(request.content)["messages"]
        asked = {c["id"] for m in messages for c in m.get("tool_calls", [])}
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        if asked - answered:
            error = {"message": f"tool calls without a response: {sorted(asked - answered)}"}
            return httpx2.Response(400, json={"error": error})
        message = self.script.pop(0)
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": None, **message},
            "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
        }
        completion = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:8],
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [choice],
        }
        return httpx2.Response(200, json=completion)


def tool_call(name: str, **args: Any) -> dict[str, Any]:
    call_id = "call_" + uuid.uuid4().hex[:8]
    function = {"name": name, "arguments": json.dumps(args)}
    return {"tool_calls": [{"id": call_id, "type": "function", "function": function}]}


def reply(text: str) -> dict[str, Any]:
    return {"content": text}


class ProcessCrashed(Exception):
    """Stands in for the process dying between running a tool and recording its answer."""


def main(db: str) -> None:
    oo = openonce.OpenOnce(db, policy=openonce.require_approval_for(["payments.refund"]))
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
    ran: Counter[str] = Counter()
    # Business ids are unique, so a second run of this example is a different customer case.
    charge_to_refund, order = "ch_" + uuid.uuid4().hex[:6], "A-" + uuid.uuid4().hex[:6]

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> dict[str, str]:
        ran["email.send"] += 1
        return {"message_id": f"<{openonce.current_effect().provider_key}@example.com>"}

    @oo.effect(tool="payments.refund", idempotency_key=lambda charge_id, **_: f"refund-{charge_id}")
    def refund(charge_id: str, amount_cents: int) -> dict[str, Any]:
        ran["payments.refund"] += 1
        return {"refund_id": "re_0001", "charge_id": charge_id, "amount_cents": amount_cents}

    @oo.effect(tool="payments.charge", idempotency_key=lambda order_id, **_: f"charge-{order_id}")
    def charge(customer_id: str, order_id: str, amount_cents: int) -> dict[str, Any]:
        ran["payments.charge"] += 1
        reference = openonce.current_effect().provider_key  # the provider dedups by it
        return provider.charge(customer_id, amount_cents, reference).receipt()

    handlers = {"send_email": send_email, "refund": refund, "charge": charge}
    email = {"to": "ada@example.com", "subject": "Your refund", "body": "It is on its way."}
    refund_args = {"charge_id": charge_to_refund, "amount_cents": 1999}
    charge_args = {"customer_id": "cus_ada", "order_id": order, "amount_cents": 4500}
    model = ScriptedChatCompletions(
        [
            tool_call("send_email", **email),
            tool_call("refund", **refund_args),
            reply("The refund is waiting for approval."),
            tool_call("refund", **refund_args),
            reply("Refunded."),
            tool_call("charge", **charge_args),
            tool_call("charge", **charge_args),  # retried although told not to
            reply("The charge is being verified; I will not retry it."),
            tool_call("charge", **charge_args),
            reply("Yes, Ada was charged."),
        ]
    )
    client = openai.OpenAI(
        api_key="sk-offline",
        base_url="http://model.invalid/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(model)),
    )
    conversation_id = "conv-" + uuid.uuid4().hex[:8]
    conversation: list[dict[str, Any]] = []
    crash_after: set[str] = {"send_email"}
    print(f"conversation {conversation_id}, ledger {db}")

    def run_tool(call: dict[str, Any]) -> str:
        name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
        # The tool call id narrows the scope to this one model decision.
        with oo.scope(f"{conversation_id}/{call['id']}"):
            try:
                return json.dumps(handlers[name](**args))
            except openonce.ApprovalPending as pending:
                return json.dumps(
                    {
                        "status": "approval_required",
                        "effect_id": pending.effect_id,
                        "instruction": "Nothing ran. Tell the user it waits for approval; after"
                        " approval call again with the same arguments.",
                    }
                )
            except openonce.OutcomeUnknownError as unknown:
                return json.dumps(
                    {
                        "status": "outcome_unknown",
                        "effect_id": unknown.effect_id,
                        "instruction": "It may have happened. Do NOT retry it.",
                    }
                )

    def answer_pending_calls() -> None:
        """Answer the last assistant message's tool calls that have no answer yet: after a
        restart, those are the calls the crashed process may or may not have run."""
        asking = next((m for m in reversed(conversation) if m.get("tool_calls")), None)
        answered = {m["tool_call_id"] for m in conversation if m["role"] == "tool"}
        for call in (asking or {}).get("tool_calls", []):
            if call["id"] in answered:
                continue
            content = run_tool(call)
            if call["function"]["name"] in crash_after:
                crash_after.discard(call["function"]["name"])
                raise ProcessCrashed(call["id"])
            conversation.append({"role": "tool", "tool_call_id": call["id"], "content": content})

    def user(text: str) -> list[dict[str, Any]]:
        """One user turn; returns the tool answers the model was given during it."""
        start = len(conversation)
        conversation.append({"role": "user", "content": text})
        return resume(start)

    def resume(start: int) -> list[dict[str, Any]]:
        while True:
            answer_pending_calls()
            completion = client.chat.completions.create(
                model="scripted", messages=conversation, tools=TOOLS
            )
            message = completion.choices[0].message
            conversation.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return [
                    json.loads(m["content"]) for m in conversation[start:] if m["role"] == "tool"
                ]

    # 1: the loop crashes after sending the email, before saving the answer.
    start = len(conversation)
    try:
        user("Ada was charged twice: refund the duplicate and tell her.")
    except ProcessCrashed as crash:
        print(f"email.send: the loop crashed after running tool call {crash}; restarting")
    answers = resume(start)  # the restarted loop answers the pending call first
    print(
        f"email.send: the restarted loop ran the same tool call again; handler ran"
        f" {times(ran['email.send'])}: duplicate replayed"
    )

    # 2: the refund waits for approval.
    (pending,) = [a for a in answers if a.get("status") == "approval_required"]
    print(
        f"payments.refund: approval required ({pending['effect_id']});"
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
    answers = user(f"Now charge Ada for order {order}.")
    unknown = [a for a in answers if a.get("status") == "outcome_unknown"]
    charge_id = unknown[0]["effect_id"]
    print(f"payments.charge: outcome unknown ({charge_id}), parked as {oo.get(charge_id).state}")
    print(
        f"payments.charge: the model retried {times(len(unknown) - 1)}; not retried"
        f" (handler ran {times(ran['payments.charge'])},"
        f" provider charged {times(len(provider.charges))})"
    )
    (found,) = provider.search(oo.get(charge_id).provider_key).charges
    oo.resolve_happened(
        charge_id, receipt=found.receipt(), by="eric", reason=f"{found.id} found at the provider"
    )
    (replayed,) = user(f"Did the charge for {order} go through?")
    print(
        f"payments.charge: resolved as happened by eric ({found.id}); the model's next call"
        f" replayed {replayed['charge_id']} (handler ran {times(ran['payments.charge'])})"
    )
    oo.close()


def times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples-openai-sdk.db")
