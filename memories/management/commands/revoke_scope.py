"""Revoke a user's grant of a scope (the API's DELETE /api/v1/scopes/<scope>/grants/<user>/, for operators)."""
from __future__ import annotations

from django.core.management.base import CommandError

from core.errors import NotFound
from memories.management.commands.grant_scope import Command as GrantCommand
from memories.models import Scope
from memories.services import scope_revoke


class Command(GrantCommand):
    help = "Stop USERNAME from using SCOPE over the API (its tokens stop reaching the scope at once)."

    def act(self, scope_row: Scope, user) -> None:
        try:
            scope_revoke(scope=scope_row, user=user)
        except NotFound as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"revoked {scope_row.name} from {user.username}")
