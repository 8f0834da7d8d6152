"""Celery tasks of the log: thin interfaces that take ids, load rows and call services.

Sending them is memories.jobs' (through core.jobs); this module imports no jobs module, so the two never
import each other.
"""
from __future__ import annotations

from celery import shared_task

from core.jobs import job_dispatch_each
from memories.models import ErasureRequest, ErasureStatus
from memories.selectors import erasure_request_status, erasure_requests_stuck
from memories.services import erasure_request_process, erasure_requeue_grace_s


class ErasureNotFinished(Exception):
    """Raised so Celery retries a request whose view rebuilding failed."""


@shared_task(
    bind=True,
    # A failed rebuild is retried with backoff; each retry is safe (the service is idempotent).
    autoretry_for=(ErasureNotFinished,),
    retry_backoff=30,
    retry_backoff_max=600,
    max_retries=5,
)
def erasure_request_process_task(self, erasure_request_id: int) -> str:
    """Process an erasure request by id (shred, rebuild views); returns the resulting status."""
    erasure_request = ErasureRequest.objects.select_related("subject").get(pk=erasure_request_id)
    erasure_request_process(erasure_request=erasure_request)
    status = erasure_request_status(erasure_request=erasure_request)
    if status == ErasureStatus.FAILED:
        raise ErasureNotFinished(f"erasure request {erasure_request_id} failed to rebuild views; retrying")
    return status


@shared_task
def erasure_requests_requeue_task() -> dict[str, list[int]]:
    """Re-send processing of erasure requests unfinished past the grace period (run by celery beat).

    memories.jobs.erasure_requests_requeue does the same for the command; it imports this module, so the
    task sends its sibling through core.jobs directly.
    """
    grace = erasure_requeue_grace_s()
    # a copy that waited a whole grace period is superseded by the next run's: let the worker drop it
    report = job_dispatch_each(erasure_request_process_task, erasure_requests_stuck(idle_for_s=grace), expires=grace)
    return {"requeued": report.sent, "errors": report.errors}
