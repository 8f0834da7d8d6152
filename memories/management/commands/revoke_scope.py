"""Revoke a user's grant of a scope (the API's DELETE /api/v1/scopes/<scope>/grants/<user>/, for operators)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from core.errors import NotFound
from memories.models import Scope
from memories.services import scope_revoke


class Command(BaseCommand):
    help = "Stop USERNAME from using SCOPE over the API (its tokens stop reaching the scope at once)."

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
        try:
            scope_revoke(scope=scope_row, user=user)
        except NotFound as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"revoked {scope_row.name} from {username}")
