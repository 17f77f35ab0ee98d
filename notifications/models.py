"""What the notifier has read of the journal, and every message it owes or sent.

The journal is the source: the daemon reads it from a durable cursor, never the agent's
hot path. One Delivery per (journal line, channel), enforced by a unique constraint, so
a tick that runs twice, a task delivered twice or a line read again sends nothing twice.
"""

from __future__ import annotations

from django.db import models


class JournalCursor(models.Model):
    """How far the notifier has read the journal (one row per reader name)."""

    name = models.CharField(max_length=50, primary_key=True)
    seq = models.BigIntegerField(default=0)  # every line up to here has been looked at
    updated_at = models.DateTimeField(auto_now=True)


class Delivery(models.Model):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # gave up after the last attempt; shown on the effect's page
    STATUSES = [(PENDING, "pending"), (SENT, "sent"), (FAILED, "failed")]

    effect_id = models.TextField()
    journal_seq = models.BigIntegerField()
    event = models.CharField(max_length=30)  # the state entered: requires_approval, ...
    tool = models.TextField()
    channel = models.CharField(max_length=100)  # the configured channel's name
    kind = models.CharField(max_length=20)  # webhook, slack or email
    destination = models.TextField()  # shown to people: a URL without its secret path
    status = models.CharField(max_length=10, choices=STATUSES, default=PENDING)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.FloatField()  # epoch seconds
    # A sender claims a delivery until this time before sending: two workers never send
    # the same delivery at once; a worker that dies leaves it to be claimed again.
    claimed_until = models.FloatField(null=True)
    last_error = models.TextField(blank=True, default="")
    last_status = models.IntegerField(null=True)  # the receiver's HTTP status, if any
    created_at = models.FloatField()
    sent_at = models.FloatField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["journal_seq", "channel"], name="delivery_once"),
        ]
        indexes = [
            # The effect's page lists its deliveries.
            models.Index(fields=["effect_id", "id"], name="delivery_effect"),
            # The sender picks what is due.
            models.Index(
                fields=["next_attempt_at"],
                name="delivery_due",
                condition=models.Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.channel} for {self.effect_id} ({self.status})"
