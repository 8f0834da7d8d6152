"""Invite a user: create the account, grant it scopes and print its first API token once."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from core.errors import MnesioError
from memories.services import user_invite


class Command(BaseCommand):
    help = (
        "Create the user USERNAME (no password: it uses API tokens), grant it the given scopes and print its first "
        "token (shown only now; it expires after MNESIO_TOKEN_DEFAULT_TTL_DAYS). The user then creates, lists and "
        "revokes their own tokens at /api/v1/tokens/."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--email", default="")
        parser.add_argument("--scope", action="append", default=[], metavar="SCOPE", help="grant it; repeatable")
        parser.add_argument("--expires-at", default=None, help="ISO 8601 instant the first token stops working")

    def handle(self, *args: Any, username: str, email: str, scope: list[str], expires_at: str | None,
               **options: Any) -> None:
        when = None
        if expires_at is not None:
            when = parse_datetime(expires_at)
            if when is None or when.tzinfo is None:
                raise CommandError(f"`--expires-at` has to be an ISO 8601 instant with a timezone but got {expires_at!r}")
        try:
            user, _token, key = user_invite(username=username, email=email, scopes=scope, expires_at=when)
        except MnesioError as exc:
            raise CommandError(exc.message) from None
        self.stderr.write(f"invited {user.get_username()}" + (f", granted {', '.join(scope)}" if scope else "")
                          + "; the token below is shown only now")
        self.stdout.write(key)
