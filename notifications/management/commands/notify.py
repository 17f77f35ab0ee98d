"""``manage.py notify``: the notifier without Celery (the embedded deployment)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from notifications.dispatch import tick


class Command(BaseCommand):
    help = "Send notifications for effects that started waiting for a person."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--watch", action="store_true", help="keep running")

    def execute(self, *args: Any, **options: Any) -> Any:
        # Before the system checks: one of them (a JSONField's) opens the database, which
        # would create an empty SQLite file where the ledger was expected.
        _require_ledger()
        return super().execute(*args, **options)

    def handle(self, *args: Any, watch: bool = False, **options: Any) -> None:
        while True:
            report = tick()
            if report.owed or report.sent or report.failed or not watch:
                self.stdout.write(
                    f"read {report.read} journal lines, owed {report.owed},"
                    f" sent {report.sent}, failed attempts {report.failed}"
                )
            if not watch:
                return
            time.sleep(settings.OPENONCE_NOTIFY_INTERVAL)


def _require_ledger() -> None:
    """Say which variable to set instead of failing deep inside a query."""
    db = connection.settings_dict
    if db["ENGINE"] == "django.db.backends.sqlite3":
        path = Path(str(db["NAME"]))
        if not path.exists():
            raise CommandError(
                f"no ledger at {path}: set OPENONCE_DATABASE to the ledger's SQLite path or"
                " postgresql:// DSN (the demo's is demo.db in the repository), then run"
                " `python manage.py migrate` once"
            )
    if "notifications_delivery" not in connection.introspection.table_names():
        raise CommandError(
            f"the database {db['NAME']} has no notification tables: set OPENONCE_DATABASE"
            " to your ledger (a SQLite path or a postgresql:// DSN), then run"
            " `python manage.py migrate` once"
        )
