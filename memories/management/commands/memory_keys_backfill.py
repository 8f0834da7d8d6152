"""Give every memory appended before memories had own keys one of its own (memories.services.backfill).

Run once after upgrading; safe to repeat (a second run finds nothing to do). Forgetting a legacy memory or
deleting a scope runs the same backfill for the parents concerned, so nothing breaks before it has run.
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import MnesioError
from memories import crypto
from memories.models import Scope
from memories.services import memory_keys_backfill


class Command(BaseCommand):
    help = (
        "Give every legacy memory (sealed with its subject's or scope's key) an own key, so it can be forgotten "
        "alone: each parent key is replaced by a new one and the old one destroyed. Safe to re-run."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--scope", help="only this scope's memories (default: every scope)")

    def handle(self, *args: Any, **options: Any) -> None:
        scope = None
        if options.get("scope"):
            scope = Scope.objects.filter(name=options["scope"]).first()
            if scope is None:
                raise CommandError(f"`--scope` {options['scope']!r} is not a scope")
        try:
            num = memory_keys_backfill(scope=scope)
        except (crypto.MasterKeyUnavailable, MnesioError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"gave {num} legacy memor{'y' if num == 1 else 'ies'} an own key")
