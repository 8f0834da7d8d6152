"""Forgetting one memory and deleting a whole scope: each files an erasure request and shreds at once.

Forgetting a memory shreds its own key at filing and files an erasure request (kind ``memory``) whose task
rebuilds every cartridge that held it; forgetting it again returns the first request. Deleting a scope marks
it deleted, shreds every key of it and files a ``scope`` erasure request that destroys its cartridges.
Legacy memories (sealed before memories had own keys) get one first (services/backfill.py).

Design: docs/design/memory-log.md ("Forgetting one memory, deleting a scope").
"""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import Conflict, MnesioError, PermissionDenied
from memories.models import ErasureKind, ErasureRequest, ErasureStatus, Scope
from memories.selectors import memory_open, scope_memory_get

from .erasure import erasure_event_record, erasure_request_shred
from .locks import log_counter_lock
from .validation import MAX_REASON_CHARS

logger = logging.getLogger("memories")


def _reason_validate(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise MnesioError("`reason` has to be non-empty text", extra={"field": "reason"})
    if len(reason) > MAX_REASON_CHARS:
        raise MnesioError(
            f"`reason` has to be at most {MAX_REASON_CHARS} characters but got {len(reason)}", extra={"field": "reason"}
        )
    return reason


def memory_forget_file(*, scope: Scope, seq: int, requested_by, reason: str = "forget this memory") -> ErasureRequest:
    """Forget the scope's memory at ``seq``: shred its own key now and file the erasure that rebuilds the views.

    404 naming `seq` for a seq that is not this scope's (another scope's memory looks like none). Forgetting it
    again returns the first request; a memory erased with its subject is a 409.
    """
    reason = _reason_validate(reason)
    memory = scope_memory_get(scope=scope, seq=seq)
    earlier = ErasureRequest.objects.filter(kind=ErasureKind.MEMORY, memory_id=memory.seq).order_by("pk").first()
    if earlier is not None:
        return earlier
    if memory_open(memory=memory).erased:
        raise Conflict(
            f"`seq` {seq} is already erased (its subject was erased or its scope deleted); there is nothing to forget",
            extra={"field": "seq", "kind": "already_erased"},
        )
    try:
        with transaction.atomic():
            erasure_request = ErasureRequest.objects.create(
                kind=ErasureKind.MEMORY, memory=memory, scope=scope, requested_by=requested_by, reason=reason
            )
            erasure_event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
    except IntegrityError:  # a concurrent forget of the same memory filed first (one request per memory)
        return ErasureRequest.objects.get(kind=ErasureKind.MEMORY, memory_id=memory.seq)
    erasure_request_shred(erasure_request=erasure_request, actor=requested_by)
    logger.info("memory forget filed id=%s seq=%s", erasure_request.pk, memory.seq)
    return erasure_request


def scope_delete_file(*, scope: Scope, requested_by, reason: str = "delete this scope") -> ErasureRequest:
    """Delete ``scope``: mark it deleted, shred every key of its memories now, and file the erasure that
    destroys its cartridges. Needs ``memories.delete_scope`` (403 naming it); safe to repeat."""
    reason = _reason_validate(reason)
    if requested_by is not None and not requested_by.has_perm("memories.delete_scope"):
        raise PermissionDenied(
            "deleting a scope needs the `memories.delete_scope` permission (staff); nothing was changed",
            extra={"field": "scope", "permission": "memories.delete_scope"},
        )
    earlier = ErasureRequest.objects.filter(kind=ErasureKind.SCOPE, scope=scope).order_by("pk").first()
    if earlier is not None:
        return earlier
    try:
        with transaction.atomic():
            log_counter_lock()  # an append in flight commits first (its memory is shredded below) or sees the deletion
            Scope.objects.filter(pk=scope.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())
            erasure_request = ErasureRequest.objects.create(
                kind=ErasureKind.SCOPE, scope=scope, requested_by=requested_by, reason=reason
            )
            erasure_event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
    except IntegrityError:  # a concurrent deletion of the same scope filed first
        return ErasureRequest.objects.get(kind=ErasureKind.SCOPE, scope=scope)
    erasure_request_shred(erasure_request=erasure_request, actor=requested_by)
    logger.info("scope deleted scope_id=%s erasure_request=%s", scope.pk, erasure_request.pk)
    return erasure_request
