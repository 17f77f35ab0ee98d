"""The notifier: read the journal from a durable cursor, owe one delivery per transition
and channel, send what is due with retries and a growing pause.

It runs in the daemon (a Celery beat task, or ``manage.py notify --watch``), never on
the agent's hot path: agents only write their journal lines, as they always do.

Journal sequence numbers are handed out when a line is inserted, but transactions commit
in their own order: line 11 can be visible while line 10 is still being committed. The
cursor therefore stops before a gap until the line after it is SETTLE_SECONDS old; a gap
still there by then is a number a rolled-back transaction used, and is passed over.

A channel with a digest (``"digest": "5m"``) is sent one message per interval instead
of one per delivery: its deliveries wait (status ``digest``) until the first tick of the
next interval claims them into that interval's Digest, a row unique per (channel,
interval), so two beats or workers racing for an interval send one message
(``claim_digest``). A digest is then claimed, sent, retried and given up as a delivery is,
and its deliveries take its outcome. Every failed attempt, of a delivery or a digest, is
kept in its ``failures``: the effect's page lists them after a retry succeeded.

Every time a tick writes or compares (a gap's age, a claim's expiry, a retry, a digest's
interval) is the ledger's clock (``ledger_now``), the one the journal's times are written
on: notifiers on hosts whose clocks disagree agree on them.

Every query a tick runs is answered by an index range of what is new or due, never by a
walk through history: the journal by ``seq`` (openonce_journal_seq on Postgres, the rowid
on SQLite), a message's line by the journal's key (effect_id, seq), the effects by their
key, the due deliveries by ``delivery_due``, the due digests by ``digest_due``, what
waits for a digest by ``delivery_digest_waiting`` and a digest's deliveries by its key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.urls import reverse

from console.context import amounts
from ledger.clients import get_openonce
from ledger.models import Effect, JournalEntry

from . import config, senders
from .models import Delivery, Digest, JournalCursor

CURSOR = "notify"
SETTLE_SECONDS = 60.0
SCAN_LIMIT = 5000  # journal lines read per tick
SEND_LIMIT = 50  # deliveries sent per tick
CLAIM_SECONDS = 60.0  # longer than one attempt's timeout
MAX_ATTEMPTS = 8
BACKOFF_SECONDS = 10.0  # then 20, 40, ... capped at BACKOFF_MAX
BACKOFF_MAX = 3600.0
DIGEST_LISTED = 10  # effects a digest lists by name; "and K more" for the rest


@dataclass(frozen=True)
class TickReport:
    read: int
    owed: int
    sent: int
    failed: int  # attempts that failed (retried later, or given up)


def tick(now: float | None = None) -> TickReport:
    now = ledger_now() if now is None else now
    read, owed = scan(now)
    sent, failed = deliver(now)
    return TickReport(read, owed, sent, failed)


def ledger_now() -> float:
    """The ledger's clock (the database's on Postgres), which wrote the journal's times:
    every notifier judges a gap's age, a claim's expiry, a retry's and a digest's interval
    on it, so two notifiers on hosts whose clocks disagree still agree. Judged on a host
    clock running ahead, a line still being committed looked old and was passed over,
    and another notifier's claim looked expired and its message was sent twice."""
    return get_openonce().clock.now()


def scan(now: float | None = None, limit: int = SCAN_LIMIT) -> tuple[int, int]:
    """Read new journal lines; owe a delivery for each entry into a waiting state that a
    channel wants. Returns (lines read, deliveries owed). Two scans at once take turns
    on the cursor row; the unique (journal line, channel) makes a repeat harmless. With
    no channel configured it reads no lines: it moves the cursor to the newest."""
    now = ledger_now() if now is None else now
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
                # A channel with a digest sends none of them alone: they wait for it.
                status=Delivery.PENDING if channel.digest is None else Delivery.DIGEST,
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
    never send one twice at once), then claim and send the digests of the channels that
    have one. Returns (messages sent, failed attempts)."""
    now = ledger_now() if now is None else now
    wanted = config.channels()
    by_name = {c.name: c for c in wanted}
    _release_undigested({c.name for c in wanted if c.digest is not None}, now)
    sent = failed = 0
    for delivery in _claimed_due(Delivery, now, limit):
        if _attempt(Delivery, delivery, by_name, now, _message) == Delivery.SENT:
            sent += 1
        else:
            failed += 1
    for channel in wanted:
        if channel.digest is not None:
            claim_digest(channel, now)
    digests_sent, digests_failed = _send_digests(by_name, now, limit)
    return sent + digests_sent, failed + digests_failed


GONE = "the channel is no longer configured"

Sendable = Delivery | Digest  # a row sent with retries


def _claim[T: (Delivery, Digest)](
    model: type[T], row_id: int, claimed_until: float | None, now: float
) -> T | None:
    """The row, claimed for this attempt; None when another worker is sending it, got
    there first, or the row is gone (its effect archived since)."""
    if claimed_until is not None and claimed_until > now:
        return None  # another worker is sending it
    claimed = model.objects.filter(
        id=row_id, status=model.PENDING, claimed_until=claimed_until
    ).update(claimed_until=now + CLAIM_SECONDS)
    if claimed != 1:
        return None  # another worker got there first
    return model.objects.filter(id=row_id).first()


def _claimed_due[T: (Delivery, Digest)](model: type[T], now: float, limit: int) -> Iterator[T]:
    """The rows due at ``now``, oldest first, each claimed for this attempt as it comes
    (one another worker is sending, or took first, is passed over)."""
    due = list(
        model.objects.filter(status=model.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at", "id")
        .values_list("id", "claimed_until")[:limit]
    )
    for row_id, claimed_until in due:
        row = _claim(model, row_id, claimed_until, now)
        if row is not None:
            yield row


def _attempt[T: (Delivery, Digest)](
    model: type[T],
    row: T,
    by_name: dict[str, config.Channel],
    now: float,
    message: Callable[[T], Any],
) -> str:
    """Send a claimed row to its channel and record the outcome (a channel no longer
    configured gives it up). Returns the status written."""
    channel = by_name.get(row.channel)
    if channel is None:
        _give_up(model, row, now, GONE)
        return model.FAILED
    return _record(model, row, now, senders.send(channel, message(row), now))


def _record(
    model: type[Delivery] | type[Digest], row: Sendable, now: float, outcome: senders.Outcome
) -> str:
    """Write one attempt's outcome, keeping a failure in ``failures`` (the page lists
    every one, also after a retry succeeded). Returns the status written. Only the
    claim's holder writes, so reading ``row.failures`` and appending is not a race."""
    attempts = row.attempts + 1
    if outcome.ok:
        model.objects.filter(id=row.id).update(
            status=model.SENT,
            attempts=attempts,
            sent_at=now,
            last_status=outcome.status,
            last_error="",
            claimed_until=None,
        )
        return model.SENT
    failures = [*row.failures, _failure(now, outcome.status, outcome.error)]
    if attempts >= MAX_ATTEMPTS:
        status, next_attempt_at = model.FAILED, now
    else:
        status = model.PENDING
        next_attempt_at = now + min(BACKOFF_MAX, BACKOFF_SECONDS * 2 ** (attempts - 1))
    model.objects.filter(id=row.id).update(
        status=status,
        attempts=attempts,
        next_attempt_at=next_attempt_at,
        last_status=outcome.status,
        last_error=outcome.error,
        failures=failures,
        claimed_until=None,
    )
    return status


def _give_up(model: type[Delivery] | type[Digest], row: Sendable, now: float, error: str) -> None:
    model.objects.filter(id=row.id).update(
        status=model.FAILED,
        last_status=None,
        last_error=error,
        failures=[*row.failures, _failure(now, None, error)],
        claimed_until=None,
        next_attempt_at=now,
    )


def _failure(at: float, status: int | None, error: str) -> dict[str, Any]:
    return {"at": at, "status": status, "error": error}


# -- digests -------------------------------------------------------------------------------


class _NothingToClaim(Exception):
    """The interval's digest would list nothing: undo the claim."""


def claim_digest(channel: config.Channel, now: float) -> Digest | None:
    """Put the channel's waiting deliveries owed before this interval began into one
    Digest, the interval's; None when there is nothing to claim or another process
    claimed this interval first.

    The claim is the insert of (channel, interval), unique (``digest_once``): two beats,
    two workers or a redelivered task racing for one interval insert the same key; on
    Postgres the second waits for the first to commit, then fails and sends nothing.
    A delivery owed in this interval waits for the next one: one message per channel per
    interval, however the burst falls. A claim that finds nothing left to list (another
    interval's claim took it) is undone, so it sends no empty message."""
    interval = channel.digest
    assert interval is not None
    window = math.floor(now / interval)
    start = window * interval
    waiting = Delivery.objects.filter(status=Delivery.DIGEST, digest=None, channel=channel.name)
    # delivery_digest_waiting (channel, created_at): the oldest waiting delivery.
    oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    if oldest is None or oldest >= start:
        return None  # nothing waits, or only what this interval owes: the next one sends it
    try:
        with transaction.atomic():
            digest = Digest.objects.create(
                channel=channel.name,
                kind=channel.kind,
                destination=channel.destination,
                window=window,
                interval=interval,
                next_attempt_at=now,
                created_at=now,
            )
            # digest_id IS NULL: on Postgres a row another interval's claim took while
            # this one waited on its lock is re-checked and left to that claim.
            count = waiting.filter(created_at__lt=start).update(digest=digest)
            if count == 0:
                raise _NothingToClaim
            Digest.objects.filter(id=digest.id).update(count=count)
    except IntegrityError:
        return None  # another process claimed this channel's interval first
    except _NothingToClaim:
        return None
    digest.count = count
    return digest


def _release_undigested(digest_channels: set[str], now: float) -> int:
    """Deliveries waiting for a digest their channel no longer has (its digest turned
    off, or the channel removed) go back to one message each: sent alone on this tick,
    or given up as any delivery of a removed channel is. Through delivery_digest_waiting,
    which holds only what waits for a digest."""
    waiting = Delivery.objects.filter(status=Delivery.DIGEST, digest=None)
    if digest_channels:
        waiting = waiting.exclude(channel__in=sorted(digest_channels))
    return waiting.update(status=Delivery.PENDING, next_attempt_at=now)


def _send_digests(by_name: dict[str, config.Channel], now: float, limit: int) -> tuple[int, int]:
    """Send the due digests, claimed and retried as deliveries are; when one is sent or
    given up, its deliveries say so too (with its failures)."""
    sent = failed = 0
    for digest in _claimed_due(Digest, now, limit):
        status = _attempt(Digest, digest, by_name, now, _digest_message)
        if status == Digest.SENT:
            sent += 1
        else:
            failed += 1
        if status == Digest.PENDING:
            continue
        settled = Digest.objects.filter(id=digest.id).first()
        if settled is not None:  # None: the daily retention deleted it (old, and unnamed)
            # digest_id's index: the digest's own deliveries.
            Delivery.objects.filter(digest_id=digest.id).update(
                status=settled.status,
                attempts=settled.attempts,
                sent_at=settled.sent_at,
                last_status=settled.last_status,
                last_error=settled.last_error,
                failures=settled.failures,
                next_attempt_at=now,
            )
    return sent, failed


def _digest_message(digest: Digest) -> senders.DigestMessage:
    listed = list(
        Delivery.objects.filter(digest_id=digest.id)
        .order_by("id")
        .values_list("effect_id", "tool", "event", "created_at")[:DIGEST_LISTED]
    )
    args = dict(
        Effect.objects.filter(id__in={row[0] for row in listed}).values_list("id", "args_json")
    )
    items = tuple(
        senders.DigestItem(
            effect_id=effect_id,
            tool=tool,
            event=event,
            amount=_amount(args.get(effect_id)),
            link=link(effect_id),
            at=at,
        )
        for effect_id, tool, event, at in listed
    )
    return senders.DigestMessage(
        digest_id=digest.id,
        channel=digest.channel,
        count=digest.count,
        items=items,
        link=_console_base() + reverse("queue"),
        at=digest.created_at,
    )


def _amount(args_json: str | None) -> str:
    """The call's amount as the console shows it (``25.00 USD``), or ""."""
    if not args_json:
        return ""
    try:
        args = json.loads(args_json)
    except ValueError:
        return ""
    found = amounts(args)
    return found[0].value if found else ""


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
    return _console_base() + reverse("effect", args=[effect_id])


def _console_base() -> str:
    return str(getattr(settings, "OPENONCE_CONSOLE_URL", "") or "").rstrip("/")
