"""``manage.py clear_lockout NAME`` (or ``--address ADDR``): end a sign-in lockout now.

For a name: its lockouts at every address and its slowdown (console.signin). For an
address: the lockout of every name from it, as the security log names the address.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from console import signin


class Command(BaseCommand):
    help = "End a name's sign-in lockout and slowdown, or an address's lockout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username", nargs="?", default="")
        parser.add_argument("--address", default="", help="an address from the security log")

    def handle(self, *args: Any, **options: Any) -> None:
        username, address = options["username"].strip(), options["address"].strip()
        if not username and not address:
            raise CommandError("give a name (clear_lockout NAME) or --address ADDRESS")
        if address:
            try:
                address = str(ipaddress.ip_address(address))
            except ValueError:
                raise CommandError(f"--address {address!r} is not an IP address") from None
        _warn_if_per_process(self)
        if username:
            signin.clear_lockout(username)
            self.stdout.write(f"cleared the sign-in lockout and slowdown of {username}")
        if address:
            signin.clear_address(address)
            self.stdout.write(f"cleared the sign-in lockout of address {address}")


def _warn_if_per_process(command: BaseCommand) -> None:
    backend = str(settings.CACHES["default"]["BACKEND"])
    if backend.endswith("LocMemCache"):
        # Each process has its own counters then: this command cannot reach the server's.
        command.stderr.write(
            "note: the sign-in counters are in each process's memory (OPENONCE_CACHE_URL="
            "locmem); this clears only this process's. Restart the web server to clear its."
        )
