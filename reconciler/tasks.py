"""Celery tasks: thin. They take ids, call the core, and leave every decision to it."""

from __future__ import annotations

from celery import Task, shared_task
from django.db import DatabaseError

from .sweep import run_batch, sweep


@shared_task(name="openonce.tick", ignore_result=True)
def tick() -> None:
    """Beat's periodic task: select due effects and fan them out in batches."""
    sweep("beat", dispatch=lambda ids, sweep_id: reconcile_batch.delay(ids, sweep_id))


@shared_task(
    bind=True,
    name="openonce.reconcile_batch",
    ignore_result=True,
    # The ledger was unreachable: try again later. Countdowns stay far below the
    # broker's visibility timeout (capped at 5 minutes).
    autoretry_for=(DatabaseError, OSError),
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=8,
)
def reconcile_batch(self: Task, effect_ids: list[str], sweep_id: int | None = None) -> None:
    """Reconcile these effects if they are still due; a second delivery changes nothing.
    The task id names the probe claims, so a redelivery after a worker died resumes them."""
    run_batch(list(effect_ids), sweep_id, self.request.id)
