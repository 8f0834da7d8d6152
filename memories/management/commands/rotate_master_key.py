"""Re-wrap every live subject and scope key with MNESIO_MASTER_KEY (old keys read with MNESIO_MASTER_KEY_OLD)."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from memories import crypto
from memories.registry import key_rewrappers
from memories.services import master_key_rotate


class Command(BaseCommand):
    help = (
        "Re-wrap all live data keys with the current master key. Set MNESIO_MASTER_KEY to the new key and "
        "MNESIO_MASTER_KEY_OLD to the previous one. Memory rows are not touched; safe to re-run."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = master_key_rotate()
            # Keys held by derived views (cartridge blob keys) are wrapped by the same master key.
            others = {name: fn() for name, fn in key_rewrappers().items()}
        except crypto.MasterKeyUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"master key {report.master_key_id}: re-wrapped {report.num_rewrapped} key(s), "
            f"{report.num_already_current} already current"
        )
        for name, num in others.items():
            self.stdout.write(f"{name}: re-wrapped {num} key(s)")
