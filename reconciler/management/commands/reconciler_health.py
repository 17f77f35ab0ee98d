"""``manage.py reconciler_health``: exit 0 when sweeps progress, 1 when they stopped."""

from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from reconciler.health import reconciler_health


class Command(BaseCommand):
    help = "Report whether the reconciler is sweeping, from the sweeps recorded in the database."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        health = reconciler_health()
        if options["json"]:
            self.stdout.write(json.dumps(health.to_json(), indent=2))
        else:
            self.stdout.write("healthy" if health.healthy else "UNHEALTHY")
            for reason in health.reasons:
                self.stdout.write(f"  - {reason}")
            for note in health.notes:
                self.stdout.write(f"  note: {note}")
            if health.last_sweep_at is not None:
                s = health.last_sweep
                self.stdout.write(
                    f"  last sweep: {health.last_sweep_at:%Y-%m-%d %H:%M:%SZ}"
                    f" ({health.last_sweep_age:.0f}s ago, every {health.interval:g}s),"
                    f" due {s['due']}, committed {s['committed']}, re-armed {s['rearmed']},"
                    f" to human review {s['escalated']}, batches {s['batches']}"
                )
            age = health.oldest_unknown_age
            self.stdout.write("  oldest UNKNOWN: " + ("none" if age is None else f"{age:.0f}s old"))
        sys.exit(0 if health.healthy else 1)
