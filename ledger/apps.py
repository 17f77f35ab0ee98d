import os
from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class LedgerConfig(AppConfig):
    name = "ledger"
    verbose_name = "OpenOnce ledger"

    def ready(self) -> None:
        post_migrate.connect(upgrade_ledger, sender=self)
        os.register_at_fork(before=close_sqlite_before_fork)


def close_sqlite_before_fork() -> None:
    """No Django SQLite connection crosses a ``fork`` (gunicorn --preload, Celery prefork).

    SQLite keeps its file locks per process, keyed by the file: a child that inherits an
    open connection to the ledger file believes it holds locks it does not, and the parent
    closing that connection later checkpoints and deletes the WAL under the child's writes.
    The core's own store closes its connections before a fork (openonce_core/_forksafe.py);
    Django's connection to the same file must go too. Django reopens it on next use."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.vendor == "sqlite" and not connection.in_atomic_block:
            connection.close()  # Django ignores this for an in-memory test database


def upgrade_ledger(
    using: str = "default", verbosity: int = 1, stdout: Any = None, **_: Any
) -> None:
    """Every ``manage.py migrate`` brings the ledger to the core's current schema version.

    The core owns the ledger's schema and its versions (openonce_core/_schema.py); a new
    core version needs no Django migration of its own. Applying it is idempotent. A ledger
    a newer OpenOnce migrated is left alone when this code can still use it (an older
    console deployed after it must not fail), and refused, saying to upgrade, when not."""
    from django.db import connections, transaction

    from openonce_core import _schema as schema

    connection = connections[using]
    dialect = {"postgresql": "postgres", "sqlite": "sqlite"}[connection.vendor]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if dialect == "postgres":
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('openonce_schema'))")
        _, after = schema.apply(cursor, dialect)
    if after > schema.SCHEMA_VERSION and verbosity >= 1 and stdout is not None:
        stdout.write(
            f"  OpenOnce ledger schema is at version {after}, newer than this OpenOnce"
            f" ({schema.SCHEMA_VERSION}), which can still use it: left as it is"
        )
