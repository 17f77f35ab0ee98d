"""Secrets.

Part of the behavioural suite: each test runs on every store (helpers.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from openonce_core import (
    OpenOnce,
    OutcomeUnknownError,
)

from .helpers import (
    PEPPER,
    raw_ledger_text,
)


def test_secret_fields_are_stored_as_digests_only_and_still_dedup(store, store_kind):
    oo = OpenOnce(store, retry_delay=0, secret_pepper=PEPPER)
    card = "4242424242424242"
    other_card = "4000056655665556"
    calls: list[str] = []

    @oo.effect(tool="stripe.charge", secret_fields=["card"])
    def charge(card: str, amount_cents: int) -> dict[str, Any]:
        calls.append(card)
        return {"id": f"pi_{len(calls)}"}

    with oo.scope("run-1"):
        first = charge(card, 500)
        again = charge(card=card, amount_cents=500)
        other = charge(other_card, 500)
        with pytest.raises(OutcomeUnknownError):
            # An ambiguous failure writes error evidence too: still no clear value in it.
            oo.effect(tool="stripe.charge.timeout", secret_fields=["card"])(_times_out)(card, 1)
    assert first == again == {"id": "pi_1"}
    assert other == {"id": "pi_2"}
    assert calls == [card, other_card]  # the handler itself gets the clear value
    effects = store.list_effects()
    assert len(effects) == 3
    for effect in effects:
        assert effect.args["card"].startswith("hmac-sha256:")
        assert card not in repr(effect)
        assert other_card not in repr(effect)
        for line in oo.journal(effect.id):
            assert card not in repr(line)
            assert other_card not in repr(line)
    if store_kind != "memory":
        raw = raw_ledger_text(store, store_kind)
        assert "stripe.charge" in raw  # the scan does read the ledger
        assert card not in raw
        assert other_card not in raw


def _times_out(card: str, amount_cents: int) -> None:
    raise TimeoutError("read timed out")
