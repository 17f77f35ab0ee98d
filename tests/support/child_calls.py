"""Decorated tools called in another process (a ``spawn`` child imports this module by
name), so a test can watch what crosses back to the parent."""

from __future__ import annotations

from typing import Any

from openonce_core import OpenOnce, UnknownOutcomeError


def refund_with_lost_reply(ledger_path: str, order: str) -> Any:
    """Call a refund whose reply is lost: the call raises ``OutcomeUnknownError`` here,
    in the child, and the process pool sends that error to the parent."""
    oo = OpenOnce(ledger_path, retry_delay=0)

    @oo.effect(tool="stripe.refund", idempotency_key=lambda order: f"refund-{order}")
    def refund(order: str) -> dict[str, str]:
        raise UnknownOutcomeError("the reply was lost after the request left")

    try:
        return refund(order)
    finally:
        oo.close()
