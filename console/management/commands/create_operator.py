"""``manage.py create_operator NAME --role ROLE``: a console account in one of the roles.

Prints the password it set (a random one unless ``--password`` is given), once. A given
password must pass the deployment's AUTH_PASSWORD_VALIDATORS, exactly as a password set
anywhere else; a refused one changes nothing (no account is created or reset). A reset
also ends the name's sign-in lockout (``clear_lockout``): a new password is useless to
someone who cannot sign in with it.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction

from console import signin
from console.roles import ROLES, sync_roles


class Command(BaseCommand):
    help = "Create (or reset) a console account with one role: " + ", ".join(ROLES)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=sorted(ROLES))
        parser.add_argument("--password", help="default: a random password, printed once")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username:
            raise CommandError("the username must not be empty")
        if not username.isprintable():
            raise CommandError("the username must not hold control or invisible characters")
        users = get_user_model()
        password = options["password"] or secrets.token_urlsafe(16)
        try:
            existing = users.objects.filter(username=username).first()
        except DatabaseError as exc:
            # Under django-admin there is no manage.py to explain this: say it here.
            raise CommandError(
                f"cannot read accounts from the ledger {connection.settings_dict['NAME']!r}"
                f" ({str(exc).strip()}). Run migrate first (`django-admin migrate`; in a checkout"
                " `make demo` or `python manage.py migrate`), or set OPENONCE_DATABASE (or"
                " OPENONCE_DB_NAME) to the deployment's ledger."
            ) from None
        try:
            # Checked against the account as it will be (UserAttributeSimilarityValidator
            # compares the password with the username), before anything is written.
            validate_password(password, existing or users(username=username))
        except ValidationError as refused:
            raise CommandError(
                "password refused, nothing changed: " + " ".join(refused.messages)
            ) from None
        with transaction.atomic():
            sync_roles()
            user, created = users.objects.get_or_create(username=username)
            user.set_password(password)
            user.save()
            user.groups.set([Group.objects.get(name=options["role"])])
        signin.clear_lockout(username)
        verb = "created" if created else "reset"
        self.stdout.write(f"sign-in lockout of {username} cleared")
        self.stdout.write(f"{verb} {username} ({options['role']}), password: {password}")
