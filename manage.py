#!/usr/bin/env python
"""Django's command-line utility for a checkout of OpenOnce (development, `make demo`).

It chooses the dev settings unless DJANGO_SETTINGS_MODULE says otherwise; with them every
command finds the demo ledger (demo.db in the checkout). An installed deployment runs
``django-admin`` with DJANGO_SETTINGS_MODULE=openonce_site.settings.production instead.
"""

import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "openonce_site.settings.dev")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    from openonce_core import SchemaVersionError

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        print(f"ImproperlyConfigured: {exc}", file=sys.stderr)
        return 2
    except (DatabaseError, SchemaVersionError) as exc:
        # The usual cause: a command run against a ledger file that was never set up (the
        # core finds no schema; Django finds no tables).
        from django.conf import settings

        message = str(exc)
        if (
            not isinstance(exc, SchemaVersionError)
            and "no such table" not in message
            and not (message.startswith("relation ") and "does not exist" in message)
        ):
            raise
        if isinstance(exc, SchemaVersionError) and exc.needs_upgrade:
            # A ledger a newer release migrated, which this one cannot use.
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(
            f"error: the ledger has no tables yet ({exc}).\n"
            f"  ledger: {settings.DATABASES['default']['NAME']}\n"
            "  Run `make demo` to create the demo ledger, or set OPENONCE_DATABASE to your\n"
            "  ledger (a SQLite path or a postgresql:// DSN) and run `python manage.py migrate`.",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
