"""The notifier's Celery task: thin, periodic, harmless when it runs twice."""

from __future__ import annotations

from celery import shared_task

from .dispatch import tick


@shared_task(name="openonce.notify", ignore_result=True)
def notify() -> None:
    """Beat's periodic task: owe deliveries for new journal lines, send what is due."""
    tick()
