"""A scripted agent run against a SQLite ledger, for `make demo`.

It leaves behind what an operator meets on a normal day: committed effects, a duplicate
that was replayed instead of re-sent, a refund waiting for approval, and a charge whose
reply was lost after Stripe took the money (UNKNOWN until evidence resolves it).

    python examples/demo_agent.py demo.db
"""

from __future__ import annotations

import sys

import openonce_core as openonce


class FakeStripe:
    """Stands in for Stripe: records charges; can lose the reply after committing."""

    def __init__(self) -> None:
        self.charges: list[dict] = []

    def charge(self, amount_cents: int, idempotency_key: str, lose_reply: bool) -> dict:
        for existing in self.charges:
            if existing["idempotency_key"] == idempotency_key:
                return existing
        charge = {"id": f"pi_{len(self.charges) + 1}", "amount": amount_cents,
                  "idempotency_key": idempotency_key}  # fmt: skip
        self.charges.append(charge)
        if lose_reply:
            raise TimeoutError("read timed out after the charge was created")
        return charge


def main(db: str) -> None:
    oo = openonce.OpenOnce(db, policy=openonce.require_approval_for(["stripe.refund"]),
                           owner="demo-agent")  # fmt: skip
    stripe = FakeStripe()
    emails: list[str] = []

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str) -> dict:
        emails.append(to)
        return {"message_id": f"<{openonce.current_effect().provider_key}@demo>"}

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order, amount_cents, lose_reply: order)
    def charge(order: str, amount_cents: int, lose_reply: bool) -> dict:
        ctx = openonce.current_effect()
        created = stripe.charge(amount_cents, ctx.provider_key, lose_reply)
        return {"stripe_id": created["id"]}

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge_id, amount_cents: charge_id)
    def refund(charge_id: str, amount_cents: int) -> dict:
        return {"refund_id": "re_1"}

    with oo.scope("demo-run-1"):
        send_email("ada@example.com", "Your order", "Thanks for your order!")
        send_email("ada@example.com", "Your order", "Thanks again for your order!")  # LLM retry
        print(f"email.send: 2 calls, {len(emails)} email sent (the duplicate was replayed)")

    print("stripe.charge order-1:", charge("order-1", 2_500, False))
    try:
        charge("order-2", 4_000, True)
    except openonce.OutcomeUnknownError as exc:
        print(f"stripe.charge order-2: UNKNOWN ({exc.effect_id}); not retried")
    try:
        charge("order-2", 4_000, True)
    except openonce.OutcomeUnknownError:
        print(f"  retry of order-2 refused too; Stripe holds {len(stripe.charges)} charges")
    try:
        refund("pi_1", 2_500)
    except openonce.ApprovalPending as pending:
        print(f"stripe.refund pi_1: waiting for approval ({pending.effect_id})")
    oo.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo.db")
