"""Re-queue erasure requests whose processing message was lost (requested or keys_shredded for too long)."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from memories.jobs import erasure_requests_requeue
from memories.services import erasure_requeue_grace_s


class Command(BaseCommand):
    help = (
        "Send erasure processing again for requests still `requested` or `keys_shredded` (and `failed` with "
        "--include-failed) whose last step is older than the grace period. Safe to run at any time: "
        "processing skips every step already recorded, so a request whose message was not lost runs twice harmlessly."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--grace-seconds",
            type=int,
            default=None,
            help=f"only requests idle at least this long (default {erasure_requeue_grace_s()}: the erasure task's "
            "hard time limit plus 10 minutes, so a task still running is not raced)",
        )
        parser.add_argument("--include-failed", action="store_true", help="also re-queue requests whose last step failed")
        parser.add_argument("--dry-run", action="store_true", help="list the requests that would be re-queued; send nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        grace = options["grace_seconds"]
        if grace is None:
            grace = erasure_requeue_grace_s()
        if grace < 0:
            raise CommandError(f"`--grace-seconds` has to be >= 0 but got {grace}")
        report = erasure_requests_requeue(
            idle_for_s=grace, include_failed=options["include_failed"], dry_run=options["dry_run"]
        )
        verb = "would re-queue" if options["dry_run"] else "re-queued"
        ids = ", ".join(str(pk) for pk in report.requeued) or "none"
        self.stdout.write(f"{verb} {len(report.requeued)} erasure request(s) idle for >= {grace} s: {ids}")
        if report.errors:
            raise CommandError(
                f"could not send {len(report.errors)} erasure request(s) ({', '.join(map(str, report.errors))}); "
                "is the broker reachable (CELERY_BROKER_URL)? Run the command again once it is"
            )
