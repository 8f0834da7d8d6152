"""`manage.py cartridge_sweep [--older-than S]`: remove blobs of compiles that died before writing a row."""
from __future__ import annotations

from django.core.management.base import BaseCommand

from ...conf import orphan_blob_grace_s
from ...storage import blobs_sweep


class Command(BaseCommand):
    help = "Destroy reserved cartridge blobs that never got a version row (a compile killed mid-way)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--older-than", type=int, default=None, help="seconds (default: the task hard time limit + 60)")

    def handle(self, *args, **options) -> None:
        older = options["older_than"] if options["older_than"] is not None else orphan_blob_grace_s()
        swept = blobs_sweep(older_than_s=older)
        self.stdout.write(f"swept {len(swept)} unclaimed blob(s)")
