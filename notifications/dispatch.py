"""The notifier: read the journal from a durable cursor, owe one delivery per transition
and channel, send what is due with retries and a growing pause.

It runs in the daemon (a Celery beat task, or ``manage.py notify --watch``), never on
the agent's hot path: agents only write their journal lines, as they always do.

Journal sequence numbers are handed out when a line is inserted, but transactions commit
in their own order: line 11 can be visible while line 10 is still being committed. The
cursor therefore stops before a gap until the line after it is SETTLE_SECONDS old; a gap
still there by then is a number a rolled-back transaction used, and is passed over.

Every query a tick runs is answered by an index range of what is new or due, never by a
walk through history: the journal by ``seq`` (openonce_journal_seq on Postgres, the rowid
on SQLite), a message's line by the journal's key (effect_id, seq), the effects by their
key, the due deliveries by ``delivery_due``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.urls import reverse

from ledger.models import Effect, JournalEntry

from . import config, senders
from .models import Delivery, JournalCursor

CURSOR = "notify"
SETTLE_SECONDS = 60.0
SCAN_LIMIT = 5000  # journal lines read per tick
SEND_LIMIT = 50  # deliveries sent per tick
CLAIM_SECONDS = 60.0  # longer than one attempt's timeout
MAX_ATTEMPTS = 8
BACKOFF_SECONDS = 10.0  # then 20, 40, ... capped at BACKOFF_MAX
BACKOFF_MAX = 3600.0


@dataclass(frozen=True)
class TickReport:
    read: int
    owed: int
    sent: int
    failed: int  # attempts that failed (retried later, or given up)


def tick(now: float | None = None) -> TickReport:
    now = time.time() if now is None else now
    read, owed = scan(now)
    sent, failed = deliver(now)
    return TickReport(read, owed, sent, failed)


def scan(now: float | None = None, limit: int = SCAN_LIMIT) -> tuple[int, int]:
    """Read new journal lines; owe a delivery for each entry into a waiting state that a
    channel wants. Returns (lines read, deliveries owed). Two scans at once take turns
    on the cursor row; the unique (journal line, channel) makes a repeat harmless. With
    no channel configured it reads no lines: it moves the cursor to the newest."""
    now = time.time() if now is None else now
    wanted = config.channels()
    if not wanted:
        _skip_to_newest()
        return 0, 0
    with transaction.atomic():
        cursor = _cursor()
        lines = list(
            JournalEntry.objects.filter(seq__gt=cursor.seq)
            .order_by("seq")
            .values_list("seq", "effect_id", "from_state", "to_state", "reason", "at")[:limit]
        )
        last = cursor.seq
        ready = []
        for line in lines:
            seq, at = line[0], line[5]
            if last >= 0 and seq != last + 1 and at > now - SETTLE_SECONDS:
                break  # an earlier line may still be committing: wait for it
            ready.append(line)
            last = seq
        events = [
            line for line in ready if line[3] in config.EVENTS and line[2] != line[3]
        ]  # entering the state: a second partial approval is not a new wait
        tools = dict(
            Effect.objects.filter(id__in={line[1] for line in events}).values_list("id", "tool")
        )
        owed = [
            Delivery(
                effect_id=effect_id,
                journal_seq=seq,
                event=to_state,
                tool=tools.get(effect_id, "?"),
                channel=channel.name,
                kind=channel.kind,
                destination=channel.destination,
                next_attempt_at=now,
                created_at=now,
            )
            for seq, effect_id, _, to_state, _, _ in events
            for channel in wanted
            if channel.wants(tools.get(effect_id, ""), to_state)
        ]
        created = Delivery.objects.bulk_create(owed, ignore_conflicts=True)
        if ready:
            cursor.seq = last
            cursor.save(update_fields=["seq", "updated_at"])
    return len(ready), len(created)


def _cursor() -> JournalCursor:
    cursor = JournalCursor.objects.select_for_update().filter(name=CURSOR).first()
    if cursor is None:
        # First run: notify from now on, not for the ledger's whole history.
        JournalCursor.objects.get_or_create(name=CURSOR, defaults={"seq": _newest_seq()})
        cursor = JournalCursor.objects.select_for_update().get(name=CURSOR)
    return cursor


def _skip_to_newest() -> None:
    """No channel wants anything: move the cursor to the newest line without reading the
    lines in between, so a channel turned on later is told from then on, not flooded
    with what happened while nobody was listening. Forward only: a tick that read an
    older newest (it started first) never moves a later tick's cursor back."""
    with transaction.atomic():
        newest = _newest_seq()
        cursor, created = JournalCursor.objects.select_for_update().get_or_create(
            name=CURSOR, defaults={"seq": newest}
        )
        if not created and newest > cursor.seq:
            cursor.seq = newest
            cursor.save(update_fields=["seq", "updated_at"])


def _newest_seq() -> int:
    """The newest line's number, one step down openonce_journal_seq (Postgres) or the
    rowid (SQLite). -1 on an empty journal: the first line read, whatever its number,
    is the start."""
    newest = JournalEntry.objects.aggregate(newest=Max("seq"))["newest"]
    return -1 if newest is None else int(newest)


def deliver(now: float | None = None, limit: int = SEND_LIMIT) -> tuple[int, int]:
    """Send due deliveries, each claimed first (a conditional update, so two workers
    never send one twice at once). Returns (sent, failed attempts)."""
    now = time.time() if now is None else now
    by_name = {c.name: c for c in config.channels()}
    due = list(
        Delivery.objects.filter(status=Delivery.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "id")
        .values_list("id", "claimed_until")[:limit]
    )
    sent = failed = 0
    for delivery_id, claimed_until in due:
        if claimed_until is not None and claimed_until > now:
            continue  # another worker is sending it
        claimed = Delivery.objects.filter(
            id=delivery_id, status=Delivery.PENDING, claimed_until=claimed_until
        ).update(claimed_until=now + CLAIM_SECONDS)
        if claimed != 1:
            continue  # another worker got there first
        delivery = Delivery.objects.filter(id=delivery_id).first()
        if delivery is None:
            continue  # its effect was archived and its deliveries forgotten since
        channel = by_name.get(delivery.channel)
        if channel is None:
            _give_up(delivery, now, "the channel is no longer configured")
            failed += 1
            continue
        outcome = senders.send(channel, _message(delivery), now)
        if outcome.ok:
            Delivery.objects.filter(id=delivery.id).update(
                status=Delivery.SENT,
                attempts=delivery.attempts + 1,
                sent_at=now,
                last_status=outcome.status,
                last_error="",
                claimed_until=None,
            )
            sent += 1
            continue
        failed += 1
        attempts = delivery.attempts + 1
        if attempts >= MAX_ATTEMPTS:
            _give_up(delivery, now, outcome.error, outcome.status, attempts)
        else:
            pause = min(BACKOFF_MAX, BACKOFF_SECONDS * 2 ** (attempts - 1))
            Delivery.objects.filter(id=delivery.id).update(
                attempts=attempts,
                next_attempt_at=now + pause,
                last_status=outcome.status,
                last_error=outcome.error,
                claimed_until=None,
            )
    return sent, failed


def _give_up(
    delivery: Delivery, now: float, error: str, status: int | None = None, attempts: int = 0
) -> None:
    Delivery.objects.filter(id=delivery.id).update(
        status=Delivery.FAILED,
        attempts=attempts or delivery.attempts,
        last_status=status,
        last_error=error,
        claimed_until=None,
        next_attempt_at=now,
    )


def _message(delivery: Delivery) -> senders.Message:
    reason = ""
    # By the journal's key (effect_id, seq): one line, whichever other indexes exist.
    line = JournalEntry.objects.filter(effect_id=delivery.effect_id, seq=delivery.journal_seq)
    found = line.values_list("reason", "at").first()
    at = delivery.created_at
    if found is not None:
        reason, at = found
    return senders.Message(
        delivery_id=delivery.id,
        effect_id=delivery.effect_id,
        tool=delivery.tool,
        event=delivery.event,
        reason=reason,
        link=link(delivery.effect_id),
        at=at,
        journal_seq=delivery.journal_seq,
    )


def link(effect_id: str) -> str:
    """The effect's page, absolute: OPENONCE_CONSOLE_URL + its path."""
    base = str(getattr(settings, "OPENONCE_CONSOLE_URL", "") or "").rstrip("/")
    return base + reverse("effect", args=[effect_id])
