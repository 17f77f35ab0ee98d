"""The Anthropic SDK (Claude): a hand-written messages tool loop. No adapter: you execute
the ``tool_use`` blocks, so ``@oo.effect`` on each handler is the whole integration.

The SDK is real (``anthropic.Anthropic``, its request building and response parsing); only
its HTTP transport is a scripted fake (``httpx2.MockTransport``), so nothing leaves the
machine.

The scope is the conversation: ``with oo.scope(conversation_id)`` around the loop. Each
handler passes ``current_effect().provider_key`` to its provider as the provider's own
idempotency key, the one defence once a request has left the process, and the evidence a
probe later looks for.

What happens:

1. Claude sends the same email twice (reworded): the second is replayed, not re-sent;
2. the refund needs approval: Claude is told, eric approves, Claude calls again and the
   refund runs once;
3. the charge's reply is lost after the provider charged: UNKNOWN, and Claude's retry
   does not run; the reconciler finds the charge at the provider by its provider key and
   commits it; the next call replays that receipt.

    python examples/anthropic_sdk.py [ledger.db]
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from typing import Any

import anthropic
import httpx2

import openonce_core as openonce
from openonce_core.testing import (
    ChargeFault,
    FakePaymentProber,
    FakePaymentProvider,
    fake_payment_capability,
)

TOOLS: list[Any] = [
    {
        "name": name,
        "description": description,
        "input_schema": {
            "type": "object",
            "properties": {p: {"type": t} for p, t in params.items()},
            "required": list(params),
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


class ScriptedMessages:
    """The HTTP side of Claude: answers each ``POST /v1/messages`` with the next scripted
    content, and refuses a request that leaves a ``tool_use`` unanswered, as the API does."""

    def __init__(self, script: list[list[dict[str, Any]]]) -> None:
        self.script = script

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        messages = json.loads(request.content)["messages"]
        blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
        asked = {b["id"] for b in blocks if b["type"] == "tool_use"}
        answered = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if asked - answered:
            error = {"type": "invalid_request_error", "message": "tool_use without tool_result"}
            return httpx2.Response(400, json={"type": "error", "error": error})
        content = self.script.pop(0)
        message = {
            "id": "msg_" + uuid.uuid4().hex[:8],
            "type": "message",
            "role": "assistant",
            "model": "scripted",
            "content": content,
            "stop_reason": "tool_use" if content[-1]["type"] == "tool_use" else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return httpx2.Response(200, json=message)


def tool_use(name: str, **args: Any) -> list[dict[str, Any]]:
    return [
        {"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:8], "name": name, "input": args}
    ]


def reply(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def main(db: str) -> None:
    oo = openonce.OpenOnce(db, policy=openonce.require_approval_for(["payments.refund"]))
    provider = FakePaymentProvider([ChargeFault.TIMEOUT_AFTER_COMMIT])
    ran: Counter[str] = Counter()

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> dict[str, str]:
        ran["email.send"] += 1
        # The provider key as the Message-ID: a probe can find this very email later.
        return {"message_id": f"<{openonce.current_effect().provider_key}@example.com>"}

    @oo.effect(tool="payments.refund", idempotency_fields=["charge_id"])
    def refund(charge_id: str, amount_cents: int) -> dict[str, Any]:
        ran["payments.refund"] += 1
        return {"refund_id": "re_0001", "charge_id": charge_id, "amount_cents": amount_cents}

    @oo.effect(tool="payments.charge", idempotency_fields=["order_id"])
    def charge(customer_id: str, order_id: str, amount_cents: int) -> dict[str, Any]:
        ran["payments.charge"] += 1
        ctx = openonce.current_effect()
        return provider.charge(customer_id, amount_cents, ctx.provider_key).receipt()

    handlers = {"send_email": send_email, "refund": refund, "charge": charge}
    email = {"to": "ada@example.com", "subject": "Your order A-17"}
    refund_args = {"charge_id": "ch_0042", "amount_cents": 1999}
    charge_args = {"customer_id": "cus_ada", "order_id": "A-18", "amount_cents": 4500}
    claude = ScriptedMessages(
        [
            tool_use("send_email", **email, body="We are refunding the duplicate charge."),
            tool_use("send_email", **email, body="We're refunding the duplicate charge!"),
            tool_use("refund", **refund_args),
            reply("The refund is waiting for approval."),
            tool_use("refund", **refund_args),
            reply("Refunded."),
            tool_use("charge", **charge_args),
            tool_use("charge", **charge_args),  # retried although told not to
            reply("The charge is being verified; I will not retry it."),
            tool_use("charge", **charge_args),
            reply("Yes, Ada was charged for A-18."),
        ]
    )
    client = anthropic.Anthropic(
        api_key="sk-ant-offline",
        base_url="http://model.invalid",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(claude)),
    )
    conversation_id = "conv-" + uuid.uuid4().hex[:8]
    messages: list[Any] = []
    print(f"conversation {conversation_id}, ledger {db}")

    def run_tool(block: Any) -> dict[str, Any]:
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": block.id}
        try:
            return {**result, "content": json.dumps(handlers[block.name](**block.input))}
        except openonce.ApprovalPending as pending:
            signal = {
                "status": "approval_required",
                "effect_id": pending.effect_id,
                "instruction": "Nothing ran. Tell the user it waits for approval; after"
                " approval call again with the same arguments.",
            }
        except openonce.OutcomeUnknownError as unknown:
            signal = {
                "status": "outcome_unknown",
                "effect_id": unknown.effect_id,
                "instruction": "It may have happened. Do NOT retry it.",
            }
        return {**result, "content": json.dumps(signal), "is_error": True}

    def user(text: str) -> list[dict[str, Any]]:
        """One user turn; the stopped calls' answers Claude was given during it."""
        messages.append({"role": "user", "content": text})
        stopped: list[dict[str, Any]] = []
        with oo.scope(conversation_id):  # dedup within this conversation
            while True:
                response = client.messages.create(
                    model="scripted", max_tokens=1024, messages=messages, tools=TOOLS
                )
                messages.append({"role": "assistant", "content": response.content})
                calls = [b for b in response.content if b.type == "tool_use"]
                if not calls:
                    return stopped
                results = [run_tool(block) for block in calls]
                stopped += [json.loads(r["content"]) for r in results if r.get("is_error")]
                messages.append({"role": "user", "content": results})

    # 1 + 2: the duplicate email, then the refund waits for approval.
    (pending,) = user("Ada was charged twice for A-17: refund the duplicate and tell her.")
    print(
        f"email.send: Claude sent the same email twice; handler ran"
        f" {times(ran['email.send'])}: duplicate replayed"
    )
    print(
        f"payments.refund: approval required ({pending['effect_id']});"
        f" handler ran {times(ran['payments.refund'])}"
    )
    oo.approve(pending["effect_id"], by="eric", reason="duplicate charge confirmed")
    user("It's approved.")
    print(
        f"payments.refund: approved by eric; Claude called again and it executed once"
        f" (handler ran {times(ran['payments.refund'])},"
        f" state {oo.get(pending['effect_id']).state})"
    )

    # 3: the charge's reply is lost after the provider charged.
    unknown = user("Now charge Ada for her new order A-18.")
    charge_id = unknown[0]["effect_id"]
    print(f"payments.charge: outcome unknown ({charge_id}), parked as {oo.get(charge_id).state}")
    print(
        f"payments.charge: Claude retried {times(len(unknown) - 1)}; not retried"
        f" (handler ran {times(ran['payments.charge'])},"
        f" provider charged {times(len(provider.charges))})"
    )
    reconciler = openonce.Reconciler(
        oo, extra_capabilities=[fake_payment_capability("payments.charge")]
    )
    reconciler.register("payments.charge", FakePaymentProber(provider))
    reconciler.reconcile_ids([charge_id])
    reconciler.close()
    receipt = oo.get(charge_id).result
    print(f"payments.charge: resolved as happened by the reconciler ({receipt['charge_id']})")
    user("Did the charge for A-18 go through?")
    replayed = json.loads(messages[-2]["content"][0]["content"])
    print(
        f"payments.charge: Claude's next call replayed {replayed['charge_id']}"
        f" (handler ran {times(ran['payments.charge'])})"
    )
    oo.close()


def times(n: int) -> str:
    return f"{n} time" if n == 1 else f"{n} times"


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples-anthropic.db")
