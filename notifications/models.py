"""What the notifier has read of the journal, and every message it owes or sent.

The journal is the source: the daemon reads it from a durable cursor, never the agent's
hot path. One Delivery per (journal line, channel), enforced by a unique constraint, so
a tick that runs twice, a task delivered twice or a line read again sends nothing twice.

A channel with a digest (``"digest": "5m"``) gets one Digest per interval instead of one
message per delivery: its deliveries wait (``status="digest"``) until a tick claims the
interval's Digest, a row unique per (channel, interval), and join it. The claim is that
insert, so two beats or workers racing for the same interval send one message.
"""

from __future__ import annotations

from django.db import models


class JournalCursor(models.Model):
    """How far the notifier has read the journal (one row per reader name)."""

    name = models.CharField(max_length=50, primary_key=True)
    seq = models.BigIntegerField(default=0)  # every line up to here has been looked at
    updated_at = models.DateTimeField(auto_now=True)


class Attempted(models.Model):
    """What a Delivery and a Digest share: sent with retries, and every failed attempt
    kept (``failures``), so the page still lists them after a retry succeeded."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"  # gave up after the last attempt; shown on the effect's page

    channel = models.CharField(max_length=100)  # the configured channel's name
    kind = models.CharField(max_length=20)  # webhook, slack or email
    destination = models.TextField()  # shown to people: a URL without its secret path
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.FloatField()  # epoch seconds
    # A sender claims a row until this time before sending: two workers never send the
    # same message at once; a worker that dies leaves it to be claimed again.
    claimed_until = models.FloatField(null=True)
    last_error = models.TextField(blank=True, default="")
    last_status = models.IntegerField(null=True)  # the receiver's HTTP status, if any
    # Every failed attempt, oldest first: {"at": epoch seconds, "status": int | None,
    # "error": str}. At most MAX_ATTEMPTS entries; written by the claim's holder only.
    failures = models.JSONField(default=list, blank=True)
    created_at = models.FloatField()
    sent_at = models.FloatField(null=True)

    class Meta:
        abstract = True


class Digest(Attempted):
    """One message for a channel's interval, listing the deliveries that joined it."""

    STATUSES = [
        (Attempted.PENDING, "pending"),
        (Attempted.SENT, "sent"),
        (Attempted.FAILED, "failed"),
    ]

    status = models.CharField(max_length=10, choices=STATUSES, default=Attempted.PENDING)
    # floor(claimed at / the channel's interval): the claim. Unique per channel.
    window = models.BigIntegerField()
    interval = models.FloatField()  # the channel's digest interval when it was claimed
    count = models.IntegerField(default=0)  # the deliveries it lists

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "window"], name="digest_once"),
        ]
        indexes = [
            # The sender picks what is due.
            models.Index(
                fields=["next_attempt_at"],
                name="digest_due",
                condition=models.Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"digest of {self.count} for {self.channel} ({self.status})"


class Delivery(Attempted):
    DIGEST = "digest"  # waits for its channel's digest, or is in one not yet sent
    STATUSES = [
        (Attempted.PENDING, "pending"),
        (Attempted.SENT, "sent"),
        (Attempted.FAILED, "failed"),
        (DIGEST, "digest"),
    ]

    effect_id = models.TextField()
    journal_seq = models.BigIntegerField()
    event = models.CharField(max_length=30)  # the state entered: requires_approval, ...
    tool = models.TextField()
    status = models.CharField(max_length=10, choices=STATUSES, default=Attempted.PENDING)
    # The digest it joined (its channel has one); its attempts are the digest's.
    digest = models.ForeignKey(
        Digest,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="deliveries",
        db_index=False,  # delivery_digest below: only the rows that are in a digest
    )

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
            # A digest's deliveries. Partial: a full index on digest_id would hold every
            # delivery that never went in one, and SQLite would walk it for IS NULL.
            models.Index(
                fields=["digest", "id"],
                name="delivery_digest",
                condition=models.Q(digest__isnull=False),
            ),
            # A digest channel's deliveries not yet in a digest, by channel and age.
            models.Index(
                fields=["channel", "created_at"],
                name="delivery_digest_waiting",
                condition=models.Q(status="digest", digest__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.channel} for {self.effect_id} ({self.status})"
