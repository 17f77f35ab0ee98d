"""A scripted agent run for `make demo`, against the SQLite ledger the console reads.

It leaves what an operator meets on a normal day: committed effects, a duplicate that was
replayed instead of re-sent, a refund waiting for approval, a charge whose reply was lost
after Stripe took the money (the reconciler finds it and commits the receipt), and an
email whose SMTP reply was lost (bare SMTP cannot prove a miss: a person decides).

    OPENONCE_DEMO_WORLD=demo-world.json python examples/demo_agent.py demo.db
"""

from __future__ import annotations

import sys

import openonce_core as openonce
from examples.demo_world import MAIL_DOMAIN, FakeSmtpRelay, FakeStripe
from openonce_core.probers.email import message_id_for
from openonce_core.probers.stripe import effect_metadata


def main(db: str) -> None:
    oo = openonce.OpenOnce(
        db,
        policy=openonce.require_approval_for(["stripe.refund"]),
        owner="demo-agent",
        migrate=False,
    )
    stripe, relay = FakeStripe(), FakeSmtpRelay()
    sent: list[str] = []

    @oo.effect(tool="email.send", idempotency_fields=["to", "subject"])
    def send_email(to: str, subject: str, body: str, lose_reply: bool = False) -> dict:
        ctx = openonce.current_effect()
        sent.append(to)
        return relay.send(message_id_for(ctx.provider_key, MAIL_DOMAIN), to, lose_reply)

    @oo.effect(tool="stripe.charge", idempotency_key=lambda order, **_: f"charge-{order}")
    def charge(order: str, amount_cents: int, currency: str, lose_reply: bool = False) -> dict:
        ctx = openonce.current_effect()
        intent = stripe.create_payment_intent(
            amount_cents, ctx.provider_key, effect_metadata(ctx), lose_reply
        )
        return {"stripe_id": intent["id"], "amount": intent["amount"]}

    @oo.effect(tool="stripe.refund", idempotency_key=lambda charge_id, **_: f"refund-{charge_id}")
    def refund(charge_id: str, amount_cents: int, currency: str) -> dict:
        return {"refund_id": "re_demo1", "charge": charge_id, "amount": amount_cents}

    with oo.scope("demo-run-1"):
        send_email("ada@example.com", "Your order", "Thanks for your order!")
        send_email("ada@example.com", "Your order", "Thanks again for your order!")  # LLM retry
        print(f"email.send     2 calls, {len(sent)} email sent: the duplicate was replayed")
        try:
            send_email("bob@example.com", "Your invoice", "Invoice attached.", lose_reply=True)
        except openonce.OutcomeUnknownError as exc:
            print(f"email.send     bob: SMTP reply lost -> UNKNOWN ({exc.effect_id})")

    print("stripe.charge  order-1:", charge("order-1", 2_500, "usd"))
    try:
        charge("order-2", 4_000, "usd", lose_reply=True)
    except openonce.OutcomeUnknownError as exc:
        print(f"stripe.charge  order-2: reply lost after the charge -> UNKNOWN ({exc.effect_id})")
    try:
        charge("order-2", 4_000, "usd", lose_reply=True)
    except openonce.OutcomeUnknownError:
        print("stripe.charge  order-2 retried by the agent: refused, not charged twice")
    try:
        refund("pi_demo1", 2_500, "usd")  # the console shows it as 25.00 USD
    except openonce.ApprovalPending as pending:
        print(f"stripe.refund  pi_demo1: waiting for approval ({pending.effect_id})")
    oo.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo.db")
