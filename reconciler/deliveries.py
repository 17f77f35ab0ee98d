"""Poison messages: a batch that kills its worker every time it runs.

Tasks ack late and are rejected when their worker is lost, so a kill -9 mid-probe is
redelivered — and a message that itself kills the worker (a prober that segfaults in a
driver, exhausts memory on one effect's data) would be redelivered forever. Each delivery
is counted durably in the database by task id before any work; a delivery that finishes
(returns, raises, retries) clears its count. A count that survives means the worker died
with it, and once it reaches OPENONCE_TASK_MAX_DELIVERIES the next delivery is
quarantined instead of run:

* a batch of several effects is split into one message per effect, so the healthy
  effects go on and only the poison one is isolated;
* a single-effect message stays quarantined: health turns red naming it, the sweep stops
  handing that effect out, and ``manage.py reconciler_quarantine --release`` (after a
  fix) gives it back to the sweep.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from .models import TaskDelivery


def begin(task_id: str, task_name: str, effect_ids: list[str], retries: int) -> bool:
    """Count this delivery; False when the message is to be quarantined, not run."""
    now = timezone.now()
    with transaction.atomic():
        row = TaskDelivery.objects.select_for_update().filter(task_id=task_id).first()
        if row is None:
            TaskDelivery.objects.create(
                task_id=task_id, task_name=task_name, effect_ids=list(effect_ids),
                retries=retries, deliveries=1, first_at=now, last_at=now,
            )  # fmt: skip
            return True
        if row.quarantined_at is not None:
            return False  # already quarantined (a copy of the message came back)
        if row.retries != retries:
            # Celery retried the task on purpose (a database outage): a new attempt.
            row.retries, row.deliveries = retries, 1
        else:
            row.deliveries += 1
        row.last_at = now
        quarantine = row.deliveries > settings.OPENONCE_TASK_MAX_DELIVERIES
        if quarantine:
            row.quarantined_at = now
            # A batch is split in the same commit, so no reader (health, the sweep) ever
            # sees the healthy effects of the batch as quarantined.
            row.split = len(row.effect_ids) > 1
        row.save()
        return not quarantine


def finish(task_id: str) -> None:
    """The delivery ended without killing its worker. Best effort: when the database is
    what failed, the count stays and the next delivery of this message counts again."""
    with contextlib.suppress(DatabaseError):
        TaskDelivery.objects.filter(task_id=task_id, quarantined_at__isnull=True).delete()


def quarantined() -> list[TaskDelivery]:
    """Messages held back for a person (split batches are history, not a problem)."""
    return list(
        TaskDelivery.objects.filter(quarantined_at__isnull=False, split=False).order_by(
            "quarantined_at"
        )
    )


def quarantined_effect_ids() -> set[str]:
    return {eid for row in quarantined() for eid in row.effect_ids}


def release(task_ids: Iterable[str] | None = None) -> int:
    """Give quarantined messages' effects back to the sweep; returns how many messages."""
    rows = TaskDelivery.objects.filter(quarantined_at__isnull=False)
    if task_ids is not None:
        rows = rows.filter(task_id__in=list(task_ids))
    deleted, _ = rows.delete()
    return deleted
