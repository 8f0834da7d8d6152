"""`manage.py cartridge_rewrap_keys`: re-wrap every cartridge blob key with the current master key."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from ...storage import blob_keys_rewrap


class Command(BaseCommand):
    help = "After a master-key rotation (MNESIO_MASTER_KEY new, MNESIO_MASTER_KEY_OLD old): re-wrap blob keys."

    def handle(self, *args, **options) -> None:
        self.stdout.write(f"re-wrapped {blob_keys_rewrap()} cartridge blob key(s)")
