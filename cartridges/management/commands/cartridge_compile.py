"""`manage.py cartridge_compile SCOPE [--head N] [--activate]`: compile (and optionally gate + activate) a scope."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.errors import MnesioError
from memories.models import Scope

from ...selectors import version_state
from ...services import cartridge_activate, cartridge_compile


class Command(BaseCommand):
    help = "Compile a scope's memories into a cartridge version (idempotent per head); --activate gates and activates it."

    def add_arguments(self, parser) -> None:
        parser.add_argument("scope", help="the scope's name")
        parser.add_argument("--head", type=int, default=None, help="log head to compile at (default: the current head)")
        parser.add_argument("--activate", action="store_true", help="evaluate the version and activate it if it passes")

    def handle(self, *args, **options) -> None:
        scope = Scope.objects.filter(name=options["scope"]).first()
        if scope is None:
            raise CommandError(f"`scope` {options['scope']!r} does not exist")
        try:
            version = cartridge_compile(scope=scope, log_head=options["head"])
            self.stdout.write(
                f"version {version.pk}: head {version.log_head}, {version.num_memories} memories, "
                f"{version.num_tokens} tokens, {version.size_bytes} bytes, sha256 {version.sha256}"
            )
            if options["activate"]:
                activation = cartridge_activate(version=version)
                self.stdout.write(f"activated (activation {activation.pk}); state {version_state(version=version)}")
        except MnesioError as exc:
            reasons = exc.extra.get("reasons") if isinstance(exc.extra, dict) else None
            raise CommandError(exc.message + (" - " + "; ".join(reasons) if reasons else "")) from None
