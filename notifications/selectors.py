"""What the console shows of notifications: each delivery and failure on an effect's page."""

from __future__ import annotations

from .config import public_destination
from .models import Delivery

DELIVERIES_SHOWN = 50


def deliveries_for(effect_id: str) -> list[Delivery]:
    # delivery_effect (effect_id, id)
    found = list(Delivery.objects.filter(effect_id=effect_id).order_by("id")[:DELIVERIES_SHOWN])
    for delivery in found:
        if delivery.kind != "email":
            # Rows written before destinations were masked kept a URL's user:password@.
            delivery.destination = public_destination(delivery.destination)
    return found
