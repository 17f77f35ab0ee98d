"""What the console shows of notifications: each delivery on an effect's page, with every
failed attempt (``failures``: at, status, error, oldest first), kept after a retry
succeeded. A delivery in a channel's digest is shown with the digest's attempts."""

from __future__ import annotations

from .config import public_destination
from .models import Delivery

DELIVERIES_SHOWN = 50


def deliveries_for(effect_id: str) -> list[Delivery]:
    """The effect's deliveries, oldest first. Each has ``failures`` (a list of
    ``{"at", "status", "error"}``), ``in_digest`` (the number of effects its digest
    lists, or 0) and ``digest_waiting`` (waits for its channel's next digest)."""
    # delivery_effect (effect_id, id); the digest by its key.
    found = list(
        Delivery.objects.filter(effect_id=effect_id)
        .select_related("digest")
        .order_by("id")[:DELIVERIES_SHOWN]
    )
    for delivery in found:
        if delivery.kind != "email":
            # Rows written before destinations were masked kept a URL's user:password@.
            delivery.destination = public_destination(delivery.destination)
        digest = delivery.digest
        delivery.in_digest = digest.count if digest is not None else 0  # type: ignore[attr-defined]
        delivery.digest_waiting = (  # type: ignore[attr-defined]
            delivery.status == Delivery.DIGEST and digest is None
        )
        if delivery.status == Delivery.DIGEST:
            # Shown as the message it travels in: the digest's attempts, not yet its own.
            delivery.status = Delivery.PENDING
            if digest is not None:
                delivery.status = digest.status
                delivery.attempts = digest.attempts
                delivery.last_error = digest.last_error
                delivery.last_status = digest.last_status
                delivery.failures = digest.failures
                delivery.next_attempt_at = digest.next_attempt_at
                delivery.sent_at = digest.sent_at
        if not delivery.failures and delivery.last_error:
            # Written before every failure was kept: its last one is all there is.
            delivery.failures = [
                {"at": None, "status": delivery.last_status, "error": delivery.last_error}
            ]
    return found
