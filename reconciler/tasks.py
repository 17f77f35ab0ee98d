"""Celery tasks: thin. They take ids, call the core, and leave every decision to it.

The envelope around them (settings in openonce_site/settings/base.py):

* the tick has its own queue (``openonce.tick``), the notifier its own
  (``openonce.notify``, notifications/tasks.py), batches theirs (``openonce.batches``): a
  worker consumes all three by default, looking at them in that order when it frees up,
  and ``celery worker -Q openonce.tick,openonce.notify`` runs a dedicated worker that
  never waits behind a backlog of batches;
* while more than OPENONCE_DISPATCH_MAX_QUEUED batches wait in their queue, a tick
  queues none (``queue.depth``): workers that are behind get no duplicates to wade
  through;
* a batch stops taking effects when the next one might not finish before the soft time
  limit, and queues the rest as a new batch (``sweep.run_batch``);
* SoftTimeLimitExceeded is never caught here: it ends the task (its effects' claims
  lapse and a later tick hands them out again);
* database errors the core raises (psycopg's, sqlite3's, Django's) are retried with a
  growing countdown far below the broker's visibility timeout;
* each delivery is counted in the database, and a message that keeps killing its worker
  is quarantined (``deliveries``).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time

import psycopg
from celery import Task, shared_task
from celery.signals import beat_init
from django.conf import settings
from django.db import DatabaseError
from django.db.models import F
from django.utils import timezone

from openonce_core._reconcile import ReconcileReport

from . import (
    deliveries,
    queue,
    retention,  # noqa: F401  (registers the openonce.retention task)
)
from .models import DaemonStart, Sweep
from .sweep import record_report, run_batch, sweep

log = logging.getLogger("openonce.reconciler")

# Errors that mean "the ledger was unreachable", whichever layer raised them.
LEDGER_ERRORS = (DatabaseError, psycopg.OperationalError, psycopg.InterfaceError,
                 sqlite3.OperationalError, OSError)  # fmt: skip


@shared_task(name="openonce.tick", ignore_result=True)
def tick() -> None:
    """Beat's periodic task: select due effects and fan them out in batches, unless the
    batch queue is behind."""
    sweep(
        "beat",
        dispatch=lambda ids, sweep_id: reconcile_batch.delay(ids, sweep_id),
        backlog=queue.depth,
    )


@shared_task(
    bind=True,
    name="openonce.reconcile_batch",
    ignore_result=True,
    # The ledger was unreachable: try again later. Countdowns stay far below the
    # broker's visibility timeout (capped at 5 minutes).
    autoretry_for=LEDGER_ERRORS,
    retry_backoff=2,
    retry_backoff_max=300,
    max_retries=8,
)
def reconcile_batch(self: Task, effect_ids: list[str], sweep_id: int | None = None) -> None:
    """Reconcile these effects if they are still due; a second delivery changes nothing.
    The task id names the probe claims, so a redelivery after a worker died resumes them."""
    ids = list(effect_ids)
    task_id = self.request.id or ""
    if task_id and not deliveries.begin(task_id, self.name, ids, self.request.retries or 0):
        _quarantine(task_id, ids, sweep_id)
        return
    try:
        run_batch(
            ids, sweep_id, task_id, deadline=_deadline(),
            on_leftover=lambda rest: reconcile_batch.delay(rest, sweep_id),
        )  # fmt: skip
    finally:
        if task_id:
            deliveries.finish(task_id)


def _deadline() -> float | None:
    """When this batch must stop taking effects: the soft time limit, less a margin for
    the writes after the last probe."""
    soft = settings.CELERY_TASK_SOFT_TIME_LIMIT
    if not soft:
        return None
    return time.monotonic() + soft - batch_margin(soft)


def batch_margin(soft_limit: float) -> float:
    return min(10.0, 0.2 * soft_limit)


def _quarantine(task_id: str, ids: list[str], sweep_id: int | None) -> None:
    limit = settings.OPENONCE_TASK_MAX_DELIVERIES
    if sweep_id is not None:
        # This delivery ends the batch without reconciling it: it still reports to its
        # sweep (as one more batch per single-effect message it queues), so the sweep can
        # finish instead of reading as workers that stopped draining the queue.
        if len(ids) > 1:
            Sweep.objects.filter(pk=sweep_id).update(batches=F("batches") + len(ids))
        record_report(sweep_id, ReconcileReport())
    if len(ids) > 1:
        # Isolate the effect that kills workers: one message per effect (begin marked
        # the batch split; a redelivery of it after a crash here queues them again).
        log.error(
            "batch %s killed its worker %d times; splitting its %d effects into"
            " single-effect batches", task_id, limit, len(ids),
            extra={"task_id": task_id},
        )  # fmt: skip
        for effect_id in ids:
            reconcile_batch.delay([effect_id], sweep_id)
        return
    log.error(
        "message %s killed its worker %d times; quarantined (manage.py"
        " reconciler_quarantine --release %s after a fix)", task_id, limit, task_id,
        extra={"task_id": task_id, "effect_id": ids[0] if ids else None},
    )  # fmt: skip


@beat_init.connect
def _beat_started(sender: object = None, **_: object) -> None:
    """Record the start so health gives the first sweep its grace period."""
    record_start("beat")


def record_start(role: str) -> None:
    try:
        DaemonStart.objects.create(
            role=role, host=socket.gethostname()[:200], pid=os.getpid(),
            started_at=timezone.now(),
        )  # fmt: skip
    except DatabaseError as exc:  # a health nicety; the daemon runs without it
        log.warning("could not record the %s start: %s", role, exc)
