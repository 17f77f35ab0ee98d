"""What the notifier keeps of the effects the retention archives: their deliveries.

The retention beat task (reconciler/retention.py) archives a batch of old terminal effects
through the core, then calls ``archive_deliveries`` to add each effect's deliveries to the
archive and ``forget_deliveries`` to delete them. Both read through ``delivery_effect``
(effect_id, id), so a batch costs its own deliveries, never the table. After the run,
``forget_old_digests`` deletes the digests older than the policy that no delivery still
names: a digest is one message about deliveries, and with them gone it tells nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.db import transaction

from .config import public_destination
from .models import Delivery, Digest

# Ids per statement: well under SQLite's limit on bound parameters.
CHUNK = 500
FIELDS = (
    "id", "effect_id", "journal_seq", "event", "tool", "channel", "kind", "destination",
    "status", "attempts", "next_attempt_at", "claimed_until", "last_error", "last_status",
    "created_at", "sent_at", "failures",
)  # fmt: skip


def archive_deliveries(effect_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each effect's deliveries, oldest first, as plain JSON-safe dicts (text, numbers,
    None); every id asked for is a key, with [] when it had none. A destination is
    written as the console shows it: rows from before destinations were masked kept a
    URL's ``user:password@``, which must not reach an archive."""
    found: dict[str, list[dict[str, Any]]] = {effect_id: [] for effect_id in _ids(effect_ids)}
    for chunk in _chunks(list(found)):
        rows = Delivery.objects.filter(effect_id__in=chunk).order_by("effect_id", "id")
        for row in rows.values(*FIELDS):
            if row["kind"] != "email":
                row["destination"] = public_destination(row["destination"])
            found[row["effect_id"]].append(row)
    return found


def forget_deliveries(effect_ids: list[str]) -> int:
    """Delete the deliveries of these effects; returns how many. All or none: a failure
    part way leaves every one of them in place for the next batch to archive again."""
    deleted = 0
    with transaction.atomic():
        for chunk in _chunks(list(dict.fromkeys(_ids(effect_ids)))):
            deleted += Delivery.objects.filter(effect_id__in=chunk).delete()[0]
    return deleted


def forget_old_digests(before: float) -> int:
    """Delete the digests claimed before ``before`` (epoch seconds) that are done (sent, or
    given up) and that no delivery names any more; returns how many. One still pending is
    kept, and so is one a delivery still names: that delivery's page lists the digest's
    attempts. At most one digest per channel per interval was ever made."""
    done = Digest.objects.filter(
        created_at__lt=before,
        status__in=[Digest.SENT, Digest.FAILED],
        deliveries__isnull=True,
    ).values_list("pk", flat=True)
    deleted = 0
    while pks := list(done[:CHUNK]):  # a year's worth at once would not fit one statement
        deleted += Digest.objects.filter(pk__in=pks).delete()[0]
    return deleted


def _ids(effect_ids: list[str]) -> list[str]:
    # A lone string would be taken for its characters: refuse it, and anything but text.
    if not isinstance(effect_ids, list | tuple) or not all(isinstance(i, str) for i in effect_ids):
        raise TypeError(f"effect_ids: a list of effect ids (strings), not {effect_ids!r:.60}")
    return list(effect_ids)


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), CHUNK):
        yield ids[start : start + CHUNK]
