"""Create an API token for a user and print it once (only its digest is stored)."""
from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.models import AuthToken


class Command(BaseCommand):
    help = (
        "Create an API token for USERNAME and print it. It is stored hashed (django-rest-knox): this is the only "
        "time it is shown; it does not expire; revoke it by deleting it in the admin (Knox > Auth tokens)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, username: str, **options: Any) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"`username` {username!r} does not exist")
        _, key = AuthToken.objects.create(user=user, expiry=None)
        self.stdout.write(key)
