"""``manage.py reconciler_quarantine``: list the batch messages held back for killing
their workers, and release them (after a fix) so the sweep hands their effects out again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from reconciler import deliveries


class Command(BaseCommand):
    help = "List quarantined reconciler messages; --release TASK_ID (or --all) gives them back."

    def add_arguments(self, parser: CommandParser) -> None:
        group = parser.add_mutually_exclusive_group()
        group.add_argument("--release", metavar="TASK_ID", nargs="+", help="release these")
        group.add_argument("--all", action="store_true", help="release every one")

    def handle(self, *args: Any, **options: Any) -> None:
        held = deliveries.quarantined()
        if options["release"] or options["all"]:
            wanted = None if options["all"] else list(options["release"])
            unknown = sorted(set(wanted or ()) - {row.task_id for row in held})
            if unknown:
                raise CommandError(f"not quarantined: {', '.join(unknown)}; nothing was released")
            released = deliveries.release(wanted)
            self.stdout.write(f"released {released} message(s); the next sweep hands their"
                              " effects out again")  # fmt: skip
            return
        if not held:
            self.stdout.write("no quarantined messages")
            return
        for row in held:
            assert row.quarantined_at is not None
            self.stdout.write(
                f"{row.task_id}  {row.quarantined_at:%Y-%m-%d %H:%M:%SZ}  deliveries"
                f" {row.deliveries}  effects {', '.join(row.effect_ids)}"
            )
