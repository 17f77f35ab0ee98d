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


class DaemonStart(models.Model):
    """A beat or a ``reconcile --watch`` loop started: health gives the first sweep after
    a start a grace period instead of calling a daemon that just came up "stopped"."""

    role = models.CharField(max_length=10)  # "beat", "watch"
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="daemon_start_latest")]


class TaskDelivery(models.Model):
    """A batch message being worked on, counted by delivery. A row that outlives its task
    means the worker died with it (kill -9, OOM, a segfault in a driver): the broker
    redelivers such a message forever, so after OPENONCE_TASK_MAX_DELIVERIES the next
    delivery quarantines it instead of running it again."""

    task_id = models.CharField(max_length=255, primary_key=True)
    task_name = models.CharField(max_length=200)
    effect_ids = models.JSONField(default=list)
    retries = models.IntegerField(default=0)  # Celery's retry count: a retry is no redelivery
    deliveries = models.IntegerField(default=1)
    first_at = models.DateTimeField()
    last_at = models.DateTimeField()
    quarantined_at = models.DateTimeField(null=True)
    # A quarantined batch of several effects is split into one message per effect, so
    # only the effect that kills workers stays quarantined; the split row is history.
    split = models.BooleanField(default=False)

    class Meta:
        indexes = [
            models.Index(
                fields=["quarantined_at"],
                name="delivery_quarantined",
                condition=models.Q(quarantined_at__isnull=False, split=False),
            )
        ]


class ProbeTally(models.Model):
    """Probes made by the workers, by tool, outcome and provider status, with a latency
    histogram: written by each batch, so ``/metrics`` on any web process sees every
    worker's probes (cumulative bucket counts, Prometheus style)."""

    BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

    tool = models.CharField(max_length=200)
    outcome = models.CharField(max_length=20)
    status = models.CharField(max_length=20)
    count = models.BigIntegerField(default=0)
    seconds_sum = models.FloatField(default=0.0)
    le_0_05 = models.BigIntegerField(default=0)
    le_0_1 = models.BigIntegerField(default=0)
    le_0_25 = models.BigIntegerField(default=0)
    le_0_5 = models.BigIntegerField(default=0)
    le_1 = models.BigIntegerField(default=0)
    le_2_5 = models.BigIntegerField(default=0)
    le_5 = models.BigIntegerField(default=0)
    le_10 = models.BigIntegerField(default=0)
    le_30 = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tool", "outcome", "status"], name="probe_tally_key")
        ]

    @staticmethod
    def bucket_field(le: float) -> str:
        return "le_" + f"{le:g}".replace(".", "_")


class ProberStatus(models.Model):
    """Whether a provider's prober is failing on credentials (401, a permission 403, an
    untrusted certificate): health turns red naming the provider and the reason until a
    probe of it succeeds again."""

    provider = models.CharField(max_length=100, primary_key=True)
    failing = models.BooleanField(default=False)
    reason = models.TextField(default="")
    tools = models.JSONField(default=list)
    since = models.DateTimeField(null=True)  # when it started failing
    last_failure_at = models.DateTimeField(null=True)
    last_success_at = models.DateTimeField(null=True)
