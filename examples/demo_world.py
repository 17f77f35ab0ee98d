"""The outside world of `make demo`, kept in one JSON file so the agent process and the
reconciler process see the same thing: a fake Stripe (payment intents with metadata) and
a fake mail relay whose sent store is not authoritative (bare SMTP).

The reconciler uses the real reference probers over these clients:
``OPENONCE_PROBERS=examples.demo_world:PROBERS``.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from openonce_core.probers import EmailMessageIdProber, StripeProber

WORLD = Path(os.environ.get("OPENONCE_DEMO_WORLD", "demo-world.json"))
MAIL_DOMAIN = "demo.openonce.dev"
_lock = threading.Lock()


def _load() -> dict[str, Any]:
    if not WORLD.exists():
        return {"payment_intents": [], "sent_mail": []}
    return json.loads(WORLD.read_text())


def _save(world: dict[str, Any]) -> None:
    tmp = WORLD.with_suffix(".tmp")
    tmp.write_text(json.dumps(world, indent=2))
    tmp.replace(WORLD)


class FakeStripe:
    """Creates payment intents like Stripe: one per Idempotency-Key; can lose the reply."""

    def create_payment_intent(
        self, amount: int, idempotency_key: str, metadata: dict[str, str], lose_reply: bool
    ) -> dict[str, Any]:
        with _lock:
            world = _load()
            for intent in world["payment_intents"]:
                if intent["idempotency_key"] == idempotency_key:
                    return intent  # Stripe replays the first response for a reused key
            intent = {
                "id": f"pi_demo{len(world['payment_intents']) + 1}",
                "amount": amount,
                "currency": "usd",
                "status": "succeeded",
                "idempotency_key": idempotency_key,
                "metadata": metadata,
            }
            world["payment_intents"].append(intent)
            _save(world)
        if lose_reply:
            raise TimeoutError("read timed out: Stripe created the charge, the reply was lost")
        return intent

    def search_payment_intents(self, provider_key: str) -> list[dict[str, Any]]:
        return [
            i
            for i in _load()["payment_intents"]
            if i["metadata"].get("openonce_provider_key") == provider_key
        ]


class FakeSmtpRelay:
    """Accepts mail; the sender keeps no reliable sent copy, so a miss proves nothing."""

    def send(self, message_id: str, to: str, lose_reply: bool) -> dict[str, Any]:
        if lose_reply:
            raise TimeoutError("SMTP: connection dropped after DATA; delivery unknown")
        with _lock:
            world = _load()
            world["sent_mail"].append({"message_id": message_id, "to": to})
            _save(world)
        return {"message_id": message_id}

    def find_sent(self, message_id: str) -> list[dict[str, Any]]:
        return [m for m in _load()["sent_mail"] if m["message_id"] == message_id]


PROBERS = {
    "stripe.charge": StripeProber(FakeStripe()),
    "email.send": (
        EmailMessageIdProber(FakeSmtpRelay(), authoritative=False, domain=MAIL_DOMAIN),
        "email_smtp",
    ),
}
