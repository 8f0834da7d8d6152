"""Re-wrap every live wrapped key (every table in memories.keyring) with MNESIO_MASTER_KEY.

Keys wrapped by the previous key are read with MNESIO_MASTER_KEY_OLD. Refused, naming the variables, before
anything changes when a live key was wrapped by a master key that neither variable holds.
"""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from memories import crypto
from memories.services import master_key_rotate


class Command(BaseCommand):
    help = (
        "Re-wrap all live data keys with the current master key. Set MNESIO_MASTER_KEY to the new key and "
        "MNESIO_MASTER_KEY_OLD to the previous one. Memory rows are not touched; safe to re-run."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            report = master_key_rotate()
        except crypto.MasterKeyUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"master key {report.master_key_id}: re-wrapped {report.num_rewrapped} key(s), "
            f"{report.num_already_current} already current"
        )
        for name, num in report.by_table.items():
            self.stdout.write(f"{name}: re-wrapped {num} key(s)")
