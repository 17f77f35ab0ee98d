"""Health that does not lie: judged by what the daemon recorded in the database.

Unhealthy when no sweep started within twice the interval (beat or workers are down, or
stalled after a broker reconnect), when a sweep's batches have not all reported back
within the task time limit (workers are not draining the queue), when a provider's
prober is failing on its credentials (named, with the provider's reason, credentials
masked), or when a message that kept killing workers is quarantined. Who may read these
reasons is the view's business (``views.health``): everyone gets only the verdict.

Start-up grace: a beat or ``reconcile --watch`` records when it started. For
OPENONCE_HEALTH_STARTUP_GRACE seconds after the newest start, "no sweep since" is not a
failure, only a note, so a daemon that just came up is not reported as stopped before
its first tick. With no start recorded and no sweep at all, it is unhealthy.

This is reconciler progress. ``/livez`` (the process answers) and ``/readyz`` (the
database is reachable and its schema current) are separate, in ``views.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from openonce_core._redact import redact_text

from . import deliveries
from .models import DaemonStart, ProberStatus, Sweep
from .sweep import oldest_unknown_age


@dataclass
class Health:
    healthy: bool
    reasons: list[str] = field(default_factory=list)  # why it is unhealthy
    notes: list[str] = field(default_factory=list)  # worth knowing, not a failure
    interval: float = 0.0
    last_sweep_at: datetime | None = None
    last_sweep_age: float | None = None
    last_finished_at: datetime | None = None
    oldest_unknown_age: float | None = None
    last_sweep: dict[str, Any] = field(default_factory=dict)
    started_at: datetime | None = None  # the newest beat / reconcile --watch start
    probers: list[dict[str, Any]] = field(default_factory=list)  # failing ones first
    quarantined: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "reasons": self.reasons,
            "notes": self.notes,
            "interval_seconds": self.interval,
            "last_sweep_at": self.last_sweep_at.isoformat() if self.last_sweep_at else None,
            "last_sweep_age_seconds": self.last_sweep_age,
            "last_finished_at": (
                self.last_finished_at.isoformat() if self.last_finished_at else None
            ),
            "oldest_unknown_age_seconds": self.oldest_unknown_age,
            "last_sweep": self.last_sweep,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "probers": self.probers,
            "quarantined": self.quarantined,
        }


def reconciler_health(at: datetime | None = None) -> Health:
    at = at or timezone.now()
    health = Health(
        healthy=True,
        interval=float(settings.OPENONCE_SWEEP_INTERVAL),
        oldest_unknown_age=oldest_unknown_age(),
    )
    start = DaemonStart.objects.order_by("-started_at").first()
    health.started_at = start.started_at if start else None
    _probers(health)
    _quarantined(health)
    last = Sweep.objects.order_by("-started_at").first()
    grace = float(settings.OPENONCE_HEALTH_STARTUP_GRACE)
    # In its start-up grace only until its first sweep: a daemon that swept once and then
    # stopped is stopped, however recently it started.
    no_sweep_since_start = last is None or (
        start is not None and last.started_at < start.started_at
    )
    starting = (
        start is not None
        and (at - start.started_at).total_seconds() <= grace
        and no_sweep_since_start
    )
    if no_sweep_since_start:
        if starting:
            assert start is not None
            age = (at - start.started_at).total_seconds()
            health.notes.append(
                f"{start.role} started {age:.0f}s ago; no sweep since yet (start-up grace"
                f" {grace:g}s)"
            )
            if last is None:
                return health
        elif last is None:
            health.healthy = False
            health.reasons.append("no sweep has run yet")
            return health
    # Judge by the interval the sweeping loop runs with (reconcile --watch --interval S
    # may differ from the setting).
    interval = health.interval = last.interval or health.interval
    health.last_sweep_at = last.started_at
    health.last_sweep_age = (at - last.started_at).total_seconds()
    health.last_sweep = {
        "source": last.source,
        "due": last.due,
        "committed": last.committed,
        "rearmed": last.rearmed,
        "escalated": last.escalated,
        "expired": last.expired,
        "lost_races": last.lost_races,
        "probes": {
            "happened": last.probes_happened,
            "not_happened": last.probes_not_happened,
            "inconclusive": last.probes_inconclusive,
            "error": last.probe_errors,
        },
        "retried": last.retried,
        "batches": f"{last.batches_done}/{last.batches}",
    }
    finished = Sweep.objects.filter(finished_at__isnull=False).order_by("-finished_at").first()
    health.last_finished_at = finished.finished_at if finished else None
    progress = Sweep.objects.filter(last_batch_at__isnull=False).order_by("-last_batch_at").first()
    progress_age = (at - progress.last_batch_at).total_seconds() if progress else None
    if health.last_sweep_age > 2 * interval and not starting:
        backlog = Sweep.objects.filter(finished_at__isnull=True).exists()
        if backlog and progress_age is not None and progress_age <= 2 * interval:
            # Workers are busy draining a backlog and the next tick waits behind it:
            # late, not stopped.
            health.notes.append(
                f"last sweep started {health.last_sweep_age:.0f}s ago, but batches keep"
                f" finishing ({progress_age:.0f}s ago): workers are draining a backlog"
            )
        else:
            health.healthy = False
            health.reasons.append(
                f"last sweep started {health.last_sweep_age:.0f}s ago; sweeps run every"
                f" {interval:g}s (beat or workers stopped)"
            )
    limit = timedelta(seconds=2 * interval + settings.CELERY_TASK_TIME_LIMIT)
    stuck = Sweep.objects.filter(finished_at__isnull=True, started_at__lt=at - limit).first()
    if stuck is not None:
        health.healthy = False
        health.reasons.append(
            f"sweep {stuck.pk} from {stuck.started_at:%H:%M:%S} UTC has {stuck.batches_done}/"
            f"{stuck.batches} batches done (workers are not draining the queue)"
        )
    return health


def _probers(health: Health) -> None:
    """A prober refused on its credentials makes health red, naming provider and reason."""
    for row in ProberStatus.objects.order_by("-failing", "provider"):
        # A provider's refusal may quote the key it refused. Masked again as it is read,
        # for rows stored before reasons were masked on the way in.
        reason = redact_text(row.reason)
        health.probers.append(
            {
                "provider": row.provider,
                "failing": row.failing,
                "reason": reason if row.failing else "",
                "tools": row.tools,
                "since": row.since.isoformat() if row.failing and row.since else None,
                "last_success_at": (
                    row.last_success_at.isoformat() if row.last_success_at else None
                ),
            }
        )
        if row.failing:
            health.healthy = False
            since = f" since {row.since:%H:%M:%S} UTC" if row.since else ""
            health.reasons.append(
                f"{row.provider} prober failing{since}: {reason}; its effects wait"
                " for a re-probe (fix the credentials)"
            )


def _quarantined(health: Health) -> None:
    for row in deliveries.quarantined():
        assert row.quarantined_at is not None
        health.quarantined.append(
            {
                "task_id": row.task_id,
                "effect_ids": row.effect_ids,
                "deliveries": row.deliveries,
                "quarantined_at": row.quarantined_at.isoformat(),
            }
        )
        health.healthy = False
        health.reasons.append(
            f"message {row.task_id} (effects {', '.join(row.effect_ids)}) killed its worker"
            f" {row.deliveries - 1} times and is quarantined since"
            f" {row.quarantined_at:%H:%M:%S} UTC; release it with manage.py reconciler_quarantine"
            f" --release {row.task_id}"
        )
