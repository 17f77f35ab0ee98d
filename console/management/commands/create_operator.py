"""``manage.py create_operator NAME --role ROLE``: a console account in one of the roles.

Prints the password it set (a random one unless ``--password`` is given), once.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError, CommandParser

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
        password = options["password"] or secrets.token_urlsafe(12)
        sync_roles()
        user, created = get_user_model().objects.get_or_create(username=username)
        user.set_password(password)
        user.save()
        user.groups.set([Group.objects.get(name=options["role"])])
        verb = "created" if created else "reset"
        self.stdout.write(f"{verb} {username} ({options['role']}), password: {password}")
