"""Create a scope, optionally granting it to users."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.errors import MnesioError
from memories.services import scope_create, scope_grant


class Command(BaseCommand):
    help = "Create a scope (a slug) and grant it to the given usernames."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="the scope name (a slug)")
        parser.add_argument("--description", default="")
        parser.add_argument("--grant", action="append", default=[], metavar="USERNAME", help="repeatable")

    def handle(self, *args: Any, name: str, description: str, grant: list[str], **options: Any) -> None:
        users = []
        for username in grant:
            user = get_user_model().objects.filter(username=username).first()
            if user is None:
                raise CommandError(f"`--grant` names user {username!r}, who does not exist")
            users.append(user)
        try:
            scope = scope_create(name=name, description=description)
        except MnesioError as exc:
            raise CommandError(exc.message) from None
        for user in users:
            scope_grant(scope=scope, user=user)
        self.stdout.write(f"created scope {scope.name}" + (f", granted to {', '.join(grant)}" if grant else ""))
