"""`manage.py cartridge_rebuild VERSION... | --all`: recompile versions from the log alone and verify the sha256."""
from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from core.errors import MnesioError

from ...models import CartridgeDestruction, CartridgeVersion
from ...services import cartridge_rebuild


class Command(BaseCommand):
    help = "Recompile cartridge versions from the log (same scope, head, configuration) and check the bytes match."

    def add_arguments(self, parser) -> None:
        parser.add_argument("versions", nargs="*", type=int, help="version ids")
        parser.add_argument("--all", action="store_true", help="every version that is not destroyed")

    def handle(self, *args, **options) -> None:
        if options["all"]:
            destroyed = CartridgeDestruction.objects.values("version_id")
            versions = list(CartridgeVersion.objects.exclude(pk__in=destroyed).order_by("id"))
        elif options["versions"]:
            versions = list(CartridgeVersion.objects.filter(pk__in=options["versions"]).order_by("id"))
            missing = sorted(set(options["versions"]) - {v.pk for v in versions})
            if missing:
                raise CommandError(f"`versions` {missing} do not exist")
        else:
            raise CommandError("name version ids or pass --all")
        mismatches = 0
        for version in versions:
            try:
                result = cartridge_rebuild(version=version)
            except MnesioError as exc:
                mismatches += 1
                self.stdout.write(f"version {version.pk}: cannot rebuild: {exc.message}")
                continue
            verdict = "matches" if result.matches else "MISMATCH"
            mismatches += not result.matches
            self.stdout.write(f"version {version.pk}: rebuilt sha256 {result.rebuilt_sha256} {verdict}")
        if mismatches:
            raise CommandError(f"{mismatches} of {len(versions)} version(s) did not rebuild to the same bytes")
        self.stdout.write(f"{len(versions)} version(s) rebuilt byte-identical from the log")
