"""Grant an existing scope to a user (idempotent)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from memories.models import Scope
from memories.services import scope_grant


class Command(BaseCommand):
    help = "Let USERNAME use SCOPE over the API."

    def add_arguments(self, parser) -> None:
        parser.add_argument("scope")
        parser.add_argument("username")

    def handle(self, *args: Any, scope: str, username: str, **options: Any) -> None:
        scope_row = Scope.objects.filter(name=scope).first()
        if scope_row is None:
            raise CommandError(f"`scope` {scope!r} does not exist")
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"`username` {username!r} does not exist")
        self.act(scope_row, user)

    def act(self, scope_row: Scope, user) -> None:
        """What the command does to the grant (revoke_scope overrides it)."""
        scope_grant(scope=scope_row, user=user)
        self.stdout.write(f"granted {scope_row.name} to {user.username}")
