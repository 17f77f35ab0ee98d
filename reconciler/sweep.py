"""One sweep, the same code path for Celery beat and for ``manage.py reconcile``.

A sweep selects due effects (STARTED with an expired lease, UNKNOWN past grace), splits
them into batches and reconciles each batch — inline, or on Celery workers. Selection
writes nothing; every decision is a fenced transition in the core, so overlapping ticks,
two beats, a redelivered task or two workers on one batch are harmless: each effect is
resolved once, the losers count a lost race.

A tick that dispatches to workers first asks how many batches already wait in the queue
(``backlog``, reconciler/queue.py): while more than OPENONCE_DISPATCH_MAX_QUEUED wait, it
claims and queues nothing. Its batches would only queue, behind those, effects they
already carry, and each would re-claim them for itself.

A batch on a worker runs against a deadline (``deadline``): it reconciles only as many
effects as can still finish before the task's soft time limit if every probe takes its
full timeout, and hands the rest back (``on_leftover``) to be queued as a new batch. So
a slow provider makes batches shorter, never kills worker children at the hard limit.

The ledger is read through the core (``ledger.clients``), never through another app's
models.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError
from django.db.models import F
from django.utils import timezone

from ledger.clients import get_openonce, get_reconciler
from openonce_core._reconcile import Reconciler, ReconcileReport

from . import deliveries, probes
from .models import Sweep

log = logging.getLogger("openonce.reconciler")

Dispatch = Callable[[list[str], int], None]
Leftover = Callable[[list[str]], None]
Backlog = Callable[[], int | None]


def sweep(
    source: str,
    dispatch: Dispatch | None = None,
    interval: float | None = None,
    backlog: Backlog | None = None,
) -> Sweep:
    """Select what is due now and reconcile it; ``dispatch`` hands batches to workers,
    unless ``backlog`` (batches waiting in their queue; None: unknown) says the queue is
    behind.

    The due UNKNOWN effects are claimed for this sweep (for OPENONCE_DISPATCH_TTL
    seconds), so the next tick does not queue them again while they wait for a worker;
    if the worker dies, the claim lapses and a later tick hands them out anew."""
    reconciler = get_reconciler()
    record = Sweep.objects.create(
        source=source,
        started_at=timezone.now(),
        interval=interval or settings.OPENONCE_SWEEP_INTERVAL,
        oldest_unknown_age=oldest_unknown_age(),
    )
    # Sweep records are operational history, not ledger truth: keep a bounded window.
    retention = timedelta(days=settings.OPENONCE_SWEEP_RETENTION_DAYS)
    Sweep.objects.filter(started_at__lt=record.started_at - retention).delete()
    if dispatch is not None and backlog is not None and _queue_behind(record.pk, backlog()):
        # Nothing claimed, nothing queued: the sweep is over as it starts.
        Sweep.objects.filter(pk=record.pk).update(finished_at=record.started_at)
        record.refresh_from_db()
        return record
    owner = claim_owner(record.pk)
    due_ids = reconciler.claim_due(
        settings.OPENONCE_SWEEP_LIMIT, owner, settings.OPENONCE_DISPATCH_TTL
    )
    # An effect whose message kept killing workers waits for a person's release.
    held = deliveries.quarantined_effect_ids()
    if held:
        due_ids = [i for i in due_ids if i not in held]
    # A small backlog is still spread over several workers instead of one batch.
    size = min(settings.OPENONCE_SWEEP_BATCH, -(-len(due_ids) // settings.OPENONCE_SWEEP_SPREAD))
    batches = list(_chunks(due_ids, max(1, size)))
    Sweep.objects.filter(pk=record.pk).update(
        due=len(due_ids),
        batches=len(batches),
        finished_at=None if batches else record.started_at,
    )
    for batch in batches:
        if dispatch is None:
            run_batch(batch, record.pk)
        else:
            dispatch(batch, record.pk)
    record.refresh_from_db()
    return record


def _queue_behind(sweep_id: int, queued: int | None) -> bool:
    """Whether more batches wait than OPENONCE_DISPATCH_MAX_QUEUED (unknown: not behind,
    and the batches' own checks keep a duplicate harmless)."""
    limit = settings.OPENONCE_DISPATCH_MAX_QUEUED
    if queued is None or queued <= limit:
        return False
    log.warning(
        "sweep %d queued no batches: %d already wait in the batch queue"
        " (OPENONCE_DISPATCH_MAX_QUEUED=%d); workers are behind", sweep_id, queued, limit,
        extra={"sweep_id": sweep_id, "queue_depth": queued},
    )  # fmt: skip
    return True


def claim_owner(sweep_id: int) -> str:
    """The sweep's dispatch claims; a batch of any sweep may take them over, since they
    only say "queued" (``Reconciler.reconcile_ids``)."""
    return f"{Reconciler.DISPATCH_PREFIX}sweep:{sweep_id}"


def per_effect_budget() -> float:
    """The longest one effect can take: its prober (OPENONCE_PROBERS registers one per
    tool) may use the whole probe timeout; half a second more for the ledger writes."""
    return float(settings.OPENONCE_PROBE_TIMEOUT) + 0.5


def run_batch(
    effect_ids: list[str],
    sweep_id: int | None,
    task_id: str | None = None,
    *,
    deadline: float | None = None,
    on_leftover: Leftover | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ReconcileReport:
    """Reconcile these effects; with a ``deadline`` (a ``clock`` time), stop taking new
    effects when the next one might not finish before it, and hand the rest to
    ``on_leftover``."""
    owner = claim_owner(sweep_id) if sweep_id is not None else None
    claimer = f"task:{task_id}" if task_id else None
    reconciler = get_reconciler()
    report = ReconcileReport()
    todo = list(effect_ids)
    budget = per_effect_budget()
    try:
        while todo:
            if deadline is None:
                chunk, todo = todo, []
            else:
                fits = int((deadline - clock()) // budget)
                if fits < 1:
                    break
                chunk, todo = todo[:fits], todo[fits:]
            report.merge(reconciler.reconcile_ids(chunk, dispatched_by=owner, claimer=claimer))
    finally:
        _flush_probe_samples(sweep_id)
    if todo:
        log.warning(
            "batch stopped before its deadline with %d of %d effects left; requeued",
            len(todo), len(effect_ids),
            extra={"sweep_id": sweep_id, "task_id": task_id, "left": len(todo)},
        )  # fmt: skip
        if on_leftover is not None:
            if sweep_id is not None:
                # One more batch for this sweep before this one reports, so the sweep is
                # never stamped finished while the rest still waits in the queue.
                Sweep.objects.filter(pk=sweep_id).update(batches=F("batches") + 1)
            on_leftover(todo)
    failures = getattr(report, "prober_failures", None)
    if failures:
        probes.record_prober_failures(failures)
    _log_decisions(report)
    if sweep_id is not None:
        record_report(sweep_id, report)
    return report


def _flush_probe_samples(sweep_id: int | None) -> None:
    """Write the probe tallies. They are telemetry: a failed write keeps its samples for
    the next batch and must not stop this one from reporting what it resolved (a batch
    that raised here would be retried, find nothing left to do, and report nothing)."""
    try:
        probes.flush()
    except DatabaseError as exc:
        log.warning(
            "could not write probe tallies (kept for the next batch): %r", exc,
            extra={"sweep_id": sweep_id},
        )  # fmt: skip


def record_report(sweep_id: int, report: ReconcileReport) -> None:
    outcomes = report.outcomes
    Sweep.objects.filter(pk=sweep_id).update(
        last_batch_at=timezone.now(),
        batches_done=F("batches_done") + 1,
        expired=F("expired") + len(report.expired),
        committed=F("committed") + len(report.committed),
        rearmed=F("rearmed") + len(report.rearmed),
        escalated=F("escalated") + len(report.escalated),
        retried=F("retried") + len(report.retried),
        lost_races=F("lost_races") + report.lost_races,
        probes_happened=F("probes_happened") + outcomes.get("happened", 0),
        probes_not_happened=F("probes_not_happened") + outcomes.get("not_happened", 0),
        probes_inconclusive=F("probes_inconclusive") + outcomes.get("inconclusive", 0),
        probe_errors=F("probe_errors") + outcomes.get("error", 0),
    )
    # The batch that completes the sweep stamps it; a redelivered batch counts again,
    # which can only make a sweep look finished sooner, never hide a stalled one.
    Sweep.objects.filter(
        pk=sweep_id, finished_at__isnull=True, batches_done__gte=F("batches")
    ).update(finished_at=timezone.now())


def oldest_unknown_age() -> float | None:
    oo = get_openonce()
    oldest = oo.store.oldest_change("unknown")
    return None if oldest is None else max(0.0, oo.clock.now() - oldest)


def _log_decisions(report: ReconcileReport) -> None:
    for what, ids in (
        ("expired into unknown", report.expired),
        ("committed", report.committed),
        ("re-armed", report.rearmed),
        ("sent to human review", report.escalated),
        ("left unknown for a re-probe", report.retried),
    ):
        for effect_id in ids:
            log.info("effect %s %s", effect_id, what, extra={"effect_id": effect_id})


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
