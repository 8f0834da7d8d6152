"""Sending the log's tasks: erasure processing after the filing commits, and the reconciler of lost messages.

Through the one dispatcher (core.jobs); memories.services never imports tasks, this module does.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from core.jobs import JobOutcome, job_dispatch, job_dispatch_each
from memories.models import ErasureRequest
from memories.selectors import erasure_requests_stuck
from memories.tasks import erasure_request_process_task

logger = logging.getLogger("memories")


def erasure_request_enqueue(*, erasure_request: ErasureRequest, background: bool = False) -> JobOutcome:
    """Queue ``erasure_request_process_task`` for the request once the current transaction commits.

    ``background``: in-process too, the rebuild runs in a thread after commit (core.jobs), so the caller answers
    before it (its shred is done already)."""
    # detached + robust: with tasks run in-process (no broker), a failing rebuild must not turn the caller's
    # committed filing into an error; the failure is logged and recorded as a `failed` event.
    return job_dispatch(erasure_request_process_task, args=[erasure_request.pk], detached=True, robust=True,
                        background=background)


@dataclass(frozen=True)
class RequeueReport:
    """What ``erasure_requests_requeue`` found and sent."""

    requeued: list[int]  # ids whose processing task was sent again
    errors: list[int]  # ids whose send (or in-process run) raised; logged, picked up by the next run


def erasure_requests_requeue(
    *, idle_for_s: int, include_failed: bool = False, expires_s: int | None = None, dry_run: bool = False
) -> RequeueReport:
    """Send processing again for requests stuck in `requested`/`keys_shredded` (and `failed`) for ``idle_for_s``.

    The reconciler for lost broker messages (manage.py erasure_requeue, and the periodic task). A request
    whose message was not lost after all is processed twice, which is harmless: erasure_request_process
    skips every step already recorded. ``expires_s`` lets a re-sent message that waited that long be
    discarded by the worker (the periodic task sends a fresh one each run, so a queue without consumers
    does not fill up with copies).
    """
    stuck = erasure_requests_stuck(idle_for_s=idle_for_s, include_failed=include_failed)
    if dry_run:
        return RequeueReport(requeued=stuck, errors=[])
    report = job_dispatch_each(erasure_request_process_task, stuck, expires=expires_s)
    if report.sent:
        logger.warning("erasure requests re-queued ids=%s idle_for_s>=%s", report.sent, idle_for_s)
    return RequeueReport(requeued=report.sent, errors=report.errors)
