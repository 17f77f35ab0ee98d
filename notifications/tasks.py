"""The notifier's Celery task: thin, periodic, harmless when it runs twice. It is routed
to its own queue, ``openonce.notify`` (settings: CELERY_TASK_ROUTES), so a message about
an effect waiting for a person never queues behind a backlog of reconcile batches."""

from __future__ import annotations

from celery import shared_task

from .dispatch import tick


@shared_task(name="openonce.notify", ignore_result=True)
def notify() -> None:
    """Beat's periodic task: owe deliveries for new journal lines, send what is due."""
    tick()
