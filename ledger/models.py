"""The ledger's tables, mapped for reading.

The core (``openonce_core``) owns these tables and their schema; every change goes through
its API (invariant 1 of ARCHITECTURE.md). These models are ``managed = False`` and are used for
queries only: nothing in the project saves them. The console, the daemon and the notifier
all read the ledger through them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any

from django.db import models


def _when(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, UTC) if ts is not None else None


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


class ReadOnlyModel(models.Model):
    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("ledger rows change only through openonce_core's API")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ledger rows are never deleted")


class Effect(ReadOnlyModel):
    id = models.TextField(primary_key=True)
    tool = models.TextField()
    idempotency_key = models.TextField()
    scope = models.TextField(null=True)
    state = models.TextField()
    args_json = models.TextField()
    args_fingerprint = models.TextField()
    provider_key = models.TextField()
    attempt = models.IntegerField()
    max_attempts = models.IntegerField()
    fence = models.BigIntegerField()
    lease_owner = models.TextField(null=True)
    lease_expires_at = models.FloatField(null=True)
    approvals_required = models.IntegerField()
    approval_ttl = models.FloatField(null=True)
    execution_status = models.TextField(null=True)
    execution_evidence_json = models.TextField(null=True)
    verification_status = models.TextField(null=True)
    verification_evidence_json = models.TextField(null=True)
    result_json = models.TextField(null=True)
    error_json = models.TextField(null=True)
    created_at = models.FloatField()
    updated_at = models.FloatField()
    next_probe_at = models.FloatField(null=True)  # schema v5; see openonce_core._due

    class Meta:
        managed = False
        db_table = "openonce_effects"
        # Rows change only through the core, so Django's add/change/delete permissions
        # would mean nothing. The console's own permissions (what a person may decide)
        # live on its proxy of this model, console.Effect.
        default_permissions = ()

    @cached_property
    def args(self) -> Any:
        return _json(self.args_json)

    @cached_property
    def result(self) -> Any:
        return _json(self.result_json)

    @cached_property
    def error(self) -> Any:
        return _json(self.error_json)

    @cached_property
    def execution_evidence(self) -> Any:
        return _json(self.execution_evidence_json)

    @cached_property
    def verification_evidence(self) -> Any:
        return _json(self.verification_evidence_json)

    @property
    def created(self) -> datetime | None:
        return _when(self.created_at)

    @property
    def updated(self) -> datetime | None:
        return _when(self.updated_at)

    @property
    def lease_expires(self) -> datetime | None:
        return _when(self.lease_expires_at)


class JournalEntry(ReadOnlyModel):
    seq = models.BigAutoField(primary_key=True)
    effect = models.ForeignKey(
        Effect, on_delete=models.DO_NOTHING, db_column="effect_id", related_name="journal"
    )
    at = models.FloatField()
    from_state = models.TextField(null=True)
    to_state = models.TextField()
    actor = models.TextField()
    reason = models.TextField()
    evidence_json = models.TextField(null=True)
    action = models.TextField()  # the move of openonce_core._states.MOVES

    class Meta:
        managed = False
        db_table = "openonce_journal"
        ordering = ["seq"]
        default_permissions = ()

    @cached_property
    def evidence(self) -> Any:
        return _json(self.evidence_json)

    @property
    def when(self) -> datetime | None:
        return _when(self.at)


class Approval(ReadOnlyModel):
    id = models.BigAutoField(primary_key=True)
    effect = models.ForeignKey(
        Effect, on_delete=models.DO_NOTHING, db_column="effect_id", related_name="approvals"
    )
    decision = models.TextField()
    decided_by = models.TextField()
    reason = models.TextField()
    args_fingerprint = models.TextField()
    at = models.FloatField()
    expires_at = models.FloatField(null=True)

    class Meta:
        managed = False
        db_table = "openonce_approvals"
        ordering = ["id"]
        default_permissions = ()

    @property
    def when(self) -> datetime | None:
        return _when(self.at)


class Tombstone(ReadOnlyModel):
    """What the retention keeps of an archived effect (openonce_core/_retention.py): its
    key, its final state and the archive file that holds it. The console reads it to say
    where an effect went (``/effects/<id>/`` answers 410 Gone).

    Its primary key is the table's own, (tool, idempotency_key), as a composite key: not
    ``effect_id``. That is unique in practice (a key has one tombstone, an effect one key),
    but the database does not enforce it (schema v7's openonce_tombstones_effect is a plain
    index), and a model must not claim a uniqueness the table does not hold. Reads by
    effect id ask for the newest tombstone naming it (``console.selectors.archived``)."""

    pk = models.CompositePrimaryKey("tool", "idempotency_key")
    tool = models.TextField()
    idempotency_key = models.TextField()
    effect_id = models.TextField()
    state = models.TextField()
    args_fingerprint = models.TextField()
    created_at = models.FloatField()
    archived_at = models.FloatField()
    archive = models.TextField()  # the archive file's path on the host that ran the retention

    class Meta:
        managed = False
        db_table = "openonce_tombstones"
        default_permissions = ()

    @property
    def created(self) -> datetime | None:
        return _when(self.created_at)

    @property
    def archived(self) -> datetime | None:
        return _when(self.archived_at)

    @property
    def archive_name(self) -> str:
        """The archive file's name without its folder: enough to find it among the
        archives, without showing every viewer the server's directories."""
        return PurePosixPath(self.archive.replace("\\", "/")).name if self.archive else ""
