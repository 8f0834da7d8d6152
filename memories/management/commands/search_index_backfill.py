"""Index the memories appended before the search index existed, and rebuild each index built with an older
tokenizer (before stemming) (memories.services.search_index_backfill).

Run once after upgrading; safe to repeat (a second run finds nothing to do) and beside a running service:
appends index their own rows, and an erasure removes what this indexed.
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from core.errors import MnesioError
from memories import crypto
from memories.models import Scope
from memories.services import search_index_backfill


class Command(BaseCommand):
    help = (
        "Add every memory not yet in the search index (opened with its keys; erased ones are left out) to it, and "
        "rebuild each scope's index built with an older tokenizer (one transaction per scope). Safe to re-run."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--scope", help="only this scope's memories (default: every live scope)")

    def handle(self, *args: Any, **options: Any) -> None:
        scope = None
        if options.get("scope"):
            scope = Scope.objects.filter(name=options["scope"], deleted_at__isnull=True).first()
            if scope is None:
                raise CommandError(f"`--scope` {options['scope']!r} is not a live scope")
        try:
            num = search_index_backfill(scope=scope)
        except (crypto.MasterKeyUnavailable, MnesioError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"indexed {num} memor{'y' if num == 1 else 'ies'}")
