"""What the console shows of notifications: each delivery and failure on an effect's page."""

from __future__ import annotations

from .models import Delivery

DELIVERIES_SHOWN = 50


def deliveries_for(effect_id: str) -> list[Delivery]:
    # delivery_effect (effect_id, id)
    return list(Delivery.objects.filter(effect_id=effect_id).order_by("id")[:DELIVERIES_SHOWN])
