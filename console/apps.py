from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "OpenOnce console"

    def ready(self) -> None:
        # Connects the sign-in failure logger (a signal receiver).
        from . import access  # noqa: F401

        post_migrate.connect(upgrade_ledger, sender=self)


def upgrade_ledger(using: str = "default", **_: Any) -> None:
    """Every ``manage.py migrate`` brings the ledger to the core's current schema version.

    The core owns the ledger's schema and its versions (openonce_core/schema.py); a new
    core version needs no Django migration of its own. Applying it is idempotent."""
    from django.db import connections, transaction

    from openonce_core import schema

    connection = connections[using]
    dialect = {"postgresql": "postgres", "sqlite": "sqlite"}[connection.vendor]
    with transaction.atomic(using=using), connection.cursor() as cursor:
        if dialect == "postgres":
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext('openonce_schema'))")
        schema.apply(cursor, dialect)
