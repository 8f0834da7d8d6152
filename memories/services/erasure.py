"""Erasure requests: file a request, shred what it erases (services/shred.py), run every view rebuilder.

Sending the processing task is memories.jobs' (erasure_request_enqueue, erasure_requests_requeue): services
never import tasks.
"""
from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, transaction

from core.errors import Conflict, MnesioError
from memories import registry
from memories.models import ErasureEvent, ErasureKind, ErasureRequest, ErasureStatus, Scope
from memories.selectors import (
    erasure_request_status,
    erasure_request_subjects,
    legacy_subject_erasable_by,
    legacy_subjects_in_scope,
    subject_get,
)

from .locks import log_counter_lock
from .search_index import search_index_erase
from .shred import memory_key_shred, scope_keys_shred, subject_shred
from .validation import MAX_REASON_CHARS, subject_id_validate

logger = logging.getLogger("memories")


def erasure_event_record(*, erasure_request: ErasureRequest, status: str, actor=None, detail: str = "") -> bool:
    """Append a status event; False if that step was already recorded (a concurrent or repeated run)."""
    try:
        with transaction.atomic():
            ErasureEvent.objects.create(request=erasure_request, status=status, actor=actor, detail=detail[:2000])
    except IntegrityError:
        return False
    return True


def erasure_request_file(
    *,
    subject: str,
    requested_by,
    reason: str,
    scope: Scope | None = None,
) -> ErasureRequest:
    """File an erasure request for a subject (status ``requested``); memories.jobs.erasure_request_enqueue processes it.

    With ``scope`` (an API client's request) it erases the subject of that scope only, and the subject
    must have memories there (404 otherwise, the same answer whether or not the id exists elsewhere).
    A legacy global subject (filed before subjects were per scope) is covered only when every scope
    holding its memories is granted to ``requested_by``; otherwise the request is refused and an
    operator erases it everywhere. Without ``scope`` it is an operator's erasure in every scope: the
    caller (admin, command) checks the `memories.erase_subject_everywhere` permission.
    """
    external_id = subject_id_validate(subject)
    if not isinstance(reason, str) or not reason.strip():
        raise MnesioError("`reason` has to be non-empty text", extra={"field": "reason"})
    if len(reason) > MAX_REASON_CHARS:
        raise MnesioError(
            f"`reason` has to be at most {MAX_REASON_CHARS} characters but got {len(reason)}", extra={"field": "reason"}
        )
    subject_row = subject_get(external_id=external_id, scope=scope)
    # every legacy row this request would reach, not only the one subject_get found: a per-scope row with the
    # same id must not let a client's request carry a legacy row's erasure into scopes it is not granted
    legacy = legacy_subjects_in_scope(external_id=external_id, scope=scope) if scope is not None else []
    if any(not legacy_subject_erasable_by(subject=row, user=requested_by) for row in legacy):
        raise Conflict(
            f"`subject` '{external_id}' was filed before subjects were kept per scope and cannot be erased "
            "through one scope; ask an operator to erase it everywhere",
            extra={"field": "subject", "kind": "legacy_subject_needs_operator"},
        )
    with transaction.atomic():
        erasure_request = ErasureRequest.objects.create(
            subject=subject_row, scope=scope, requested_by=requested_by, reason=reason
        )
        erasure_event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
    logger.info("erasure request filed id=%s subject_id=%s", erasure_request.pk, subject_row.pk)
    return erasure_request



def erasure_requeue_grace_s() -> int:
    """How long a request may sit unfinished before it is re-queued: past the erasure task's hard time limit.

    Within it the task may still be running (or waiting behind compiles on the gpu queue); after it, the
    message is presumed lost (a broker restarted without persistence, a worker killed before it acked).
    """
    return int(getattr(settings, "CELERY_TASK_TIME_LIMIT", 1800)) + 600


def erasure_request_shred(*, erasure_request: ErasureRequest, actor=None) -> None:
    """Shred what the request erases and record ``keys_shredded`` (once; a repeat finds the step recorded).

    A subject's: its subjects' keys; one memory's: its own key; a scope's: every key of its memories.
    The shred's row lock orders it against compiles: a compile locks its manifest's subjects and own keys
    before storing a version (cartridges.services.compile), so once this commits no compile can store a
    version holding what it erased, and every earlier one is visible to the rebuild.
    """
    if ErasureEvent.objects.filter(request=erasure_request, status=ErasureStatus.KEYS_SHREDDED).exists():
        return
    if erasure_request.kind == ErasureKind.MEMORY:
        memory_key_shred(memory=erasure_request.memory)  # may re-key a legacy parent: its own transactions
    elif erasure_request.kind == ErasureKind.SCOPE:
        scope_keys_shred(scope=erasure_request.scope)
    with transaction.atomic():
        # The locks in the order an append takes them: the log counter (search_index_erase needs it), then the
        # subject rows. Shredding the subjects first deadlocked with an append for one of them.
        log_counter_lock()
        for subject in erasure_request_subjects(erasure_request=erasure_request):
            subject_shred(subject=subject)
        search_index_erase(erasure_request=erasure_request)
        erasure_event_record(erasure_request=erasure_request, status=ErasureStatus.KEYS_SHREDDED, actor=actor)


def erasure_request_process(*, erasure_request: ErasureRequest, actor=None) -> ErasureRequest:
    """Shred the keys (erasure_request_shred), record ``keys_shredded``, run every view rebuilder, record ``views_rebuilt``.

    A rebuilder that raises records ``failed`` with the reason (and the request can be processed
    again). Safe to run twice: each step checks what is already recorded, the shred is a conditional
    update, and each step's event is unique per request.
    """
    done = set(ErasureEvent.objects.filter(request=erasure_request).values_list("status", flat=True))
    if ErasureStatus.VIEWS_REBUILT in done:
        return erasure_request
    if ErasureStatus.KEYS_SHREDDED not in done:
        erasure_request_shred(erasure_request=erasure_request, actor=actor)
    rebuilders = registry.view_rebuilders()
    for rebuilder in rebuilders:
        name = getattr(rebuilder, "__qualname__", repr(rebuilder))
        try:
            rebuilder(erasure_request)
        except Exception as exc:  # any failure is recorded, not lost; the task retries
            logger.exception("erasure view rebuilder failed id=%s rebuilder=%s", erasure_request.pk, name)
            erasure_event_record(
                erasure_request=erasure_request,
                status=ErasureStatus.FAILED,
                actor=actor,
                detail=f"{name}: {type(exc).__name__}: {exc}"[:2000],
            )
            return erasure_request
    erasure_event_record(
        erasure_request=erasure_request,
        status=ErasureStatus.VIEWS_REBUILT,
        actor=actor,
        detail=f"{len(rebuilders)} view rebuilder(s) ran",
    )
    logger.info("erasure request processed id=%s status=%s", erasure_request.pk, erasure_request_status(erasure_request=erasure_request))
    return erasure_request

