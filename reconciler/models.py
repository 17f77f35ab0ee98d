"""What each sweep did, recorded in the database so health is judged by progress, not by
whether a process is alive (workers can stall silently after a broker reconnect)."""

from __future__ import annotations

from django.db import models


class Sweep(models.Model):
    SOURCES = [
        ("beat", "Celery beat"),
        ("watch", "reconcile --watch"),
        ("once", "reconcile --once"),
    ]

    source = models.CharField(max_length=10, choices=SOURCES)
    started_at = models.DateTimeField()
    # Seconds until the next sweep is expected (null: OPENONCE_SWEEP_INTERVAL).
    interval = models.FloatField(null=True)
    # When a batch of this sweep last reported back: workers progressing, even when the
    # next tick is stuck in the queue behind a backlog.
    last_batch_at = models.DateTimeField(null=True)
    # Set when the last batch of this sweep reported back; null while work is pending.
    finished_at = models.DateTimeField(null=True)
    due = models.IntegerField(default=0)
    batches = models.IntegerField(default=0)
    batches_done = models.IntegerField(default=0)
    expired = models.IntegerField(default=0)
    committed = models.IntegerField(default=0)
    rearmed = models.IntegerField(default=0)
    escalated = models.IntegerField(default=0)
    retried = models.IntegerField(default=0)
    lost_races = models.IntegerField(default=0)
    probes_happened = models.IntegerField(default=0)
    probes_not_happened = models.IntegerField(default=0)
    probes_inconclusive = models.IntegerField(default=0)
    probe_errors = models.IntegerField(default=0)
    oldest_unknown_age = models.FloatField(null=True)  # seconds, at the start of the sweep

    class Meta:
        # Health reads the newest sweep, the newest finished one, the newest batch report
        # and any old unfinished one; each has an index, so a month of 5 s ticks
        # (half a million rows) costs nothing to ask.
        indexes = [
            models.Index(fields=["-started_at"], name="sweep_latest"),
            models.Index(
                fields=["-finished_at"],
                name="sweep_finished",
                condition=models.Q(finished_at__isnull=False),
            ),
            models.Index(
                fields=["-last_batch_at"],
                name="sweep_progress",
                condition=models.Q(last_batch_at__isnull=False),
            ),
            models.Index(
                fields=["started_at"],
                name="sweep_pending",
                condition=models.Q(finished_at__isnull=True),
            ),
        ]
        get_latest_by = "started_at"

    def __str__(self) -> str:
        return f"sweep {self.pk} ({self.source}) at {self.started_at:%Y-%m-%d %H:%M:%S}"
