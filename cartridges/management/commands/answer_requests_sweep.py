"""`manage.py answer_requests_sweep [--older-than S]`: expire answer requests that were never collected."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from ...conf import answer_request_ttl_s
from ...services import answer_requests_sweep


class Command(BaseCommand):
    help = "Delete answer requests (and their keys) older than MNESIO_ANSWER_REQUEST_TTL_S; celery beat runs it too."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=int, default=None, help="seconds (default: MNESIO_ANSWER_REQUEST_TTL_S, 3600)")

    def handle(self, *args: Any, **options: Any) -> None:
        older = options["older_than"] if options["older_than"] is not None else answer_request_ttl_s()
        self.stdout.write(f"swept {answer_requests_sweep(older_than_s=older)} answer request(s) never collected")
