"""``manage.py notify``: the notifier without Celery (the embedded deployment)."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from notifications.dispatch import tick


class Command(BaseCommand):
    help = "Send notifications for effects that started waiting for a person."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--watch", action="store_true", help="keep running")

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
