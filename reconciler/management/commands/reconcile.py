"""``manage.py reconcile``: the reconciler loop without Celery, for the embedded default.

Runs exactly the sweep the Celery beat tick runs, with the batches processed inline.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from reconciler.sweep import sweep
from reconciler.tasks import record_start


class Command(BaseCommand):
    help = "Probe providers to resolve UNKNOWN effects: once, or every --interval seconds."

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group()
        mode.add_argument("--once", action="store_true", help="one sweep, then exit (default)")
        mode.add_argument("--watch", action="store_true", help="sweep until stopped")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="seconds between sweeps (default OPENONCE_SWEEP_INTERVAL)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"]
        if interval is None:
            interval = settings.OPENONCE_SWEEP_INTERVAL
        elif not 0 < interval < float("inf"):
            raise CommandError(f"--interval must be a positive number of seconds, not {interval}")
        if not options["watch"]:
            self._report(sweep("once", interval=interval))
            return
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        record_start("watch")
        self.stderr.write(f"reconciling every {interval:g}s; Ctrl-C stops")
        while not stopping.is_set():
            record = sweep("watch", interval=interval)
            if record.due:
                self._report(record)
            stopping.wait(interval)

    def _report(self, record: Any) -> None:
        record.refresh_from_db()
        self.stdout.write(
            f"{record.started_at:%Y-%m-%d %H:%M:%SZ} due {record.due}:"
            f" expired {record.expired}, committed {record.committed},"
            f" re-armed {record.rearmed}, to human review {record.escalated},"
            f" probe retries {record.retried}, lost races {record.lost_races}"
        )
