"""The daily retention task: expired console sessions, then the ledger's retention.

Beat queues ``openonce.retention`` once a day (``CELERY_BEAT_SCHEDULE``). It always
deletes expired Django sessions (what ``manage.py clearsessions`` does). When
``OPENONCE_RETENTION_DAYS`` is set, it also archives, then deletes, the terminal effects
last changed longer ago than that, with their journal lines, approvals and the notifier's
deliveries (kept in the archive line under ``"deliveries"``), through the core
(``openonce_core._retention``): archives go to ``OPENONCE_RETENTION_ARCHIVE_DIR``. The
notifier's digests older than that which no delivery names any more go too.

A run is bounded by half the task's soft time limit; when more is left it queues the
next run, so any daily volume is archived in a chain of bounded tasks. Two runs at once
(a re-queued one and beat's) do no harm: each batch locks and re-reads its rows, and an
effect is archived once.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import import_module

from celery import shared_task
from django.conf import settings

from ledger.clients import get_openonce
from notifications.retention import archive_deliveries, forget_deliveries, forget_old_digests
from openonce_core._retention import RetentionPolicy, RetentionReport, run_retention

log = logging.getLogger("openonce.retention")

DAY = 86400.0


@shared_task(name="openonce.retention", ignore_result=True)
def retention() -> None:
    """Beat's daily task (see the module docstring)."""
    clear_expired_sessions()
    report = archive_old_effects()
    if report is not None and report.more:
        retention.apply_async(countdown=1)  # the rest, in a run of its own


def clear_expired_sessions() -> None:
    """``manage.py clearsessions``: a session engine that cannot list its sessions (the
    cache or signed cookies) expires them on its own."""
    engine = import_module(settings.SESSION_ENGINE)
    with contextlib.suppress(NotImplementedError):
        engine.SessionStore.clear_expired()


def archive_old_effects() -> RetentionReport | None:
    """One bounded run of the ledger's retention; None when it is off."""
    days = settings.OPENONCE_RETENTION_DAYS
    if not days:
        return None
    report = run_retention(
        get_openonce().store,
        retention_policy(days * DAY),
        settings.OPENONCE_RETENTION_ARCHIVE_DIR,
        deliveries=archive_deliveries,
        forget_deliveries=forget_deliveries,
    )
    if report.effects or report.kept:
        log.info("retention: %s", report)
    digests = forget_old_digests(report.cutoff)
    if digests:
        log.info("retention: %d notification digests older than the cutoff deleted", digests)
    return report


def retention_policy(older_than: float) -> RetentionPolicy:
    """The task's policy from the settings, for effects last changed more than
    ``older_than`` seconds ago: its batches, its pace beside the live agents
    (``OPENONCE_RETENTION_RATE``, ``OPENONCE_RETENTION_BUSY``, ``OPENONCE_RETENTION_PAUSE``),
    and half the task's soft time limit per run."""
    return RetentionPolicy(
        older_than=older_than,
        batch_size=settings.OPENONCE_RETENTION_BATCH,
        pause=settings.OPENONCE_RETENTION_PAUSE or 0.0,
        max_rate=settings.OPENONCE_RETENTION_RATE or None,  # 0: no cap
        max_busy=settings.OPENONCE_RETENTION_BUSY,
        max_seconds=settings.CELERY_TASK_SOFT_TIME_LIMIT / 2,
    )
