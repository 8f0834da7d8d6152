"""Forgetting one memory, deleting a whole scope, and giving memories without an own key keys of their own.

Forgetting a memory shreds its own key at filing and files an erasure request (kind ``memory``) whose task
rebuilds every cartridge that held it; forgetting it again returns the first request. Deleting a scope marks
it deleted, shreds every key of it and files a ``scope`` erasure request that destroys its cartridges.
``memory_keys_backfill`` re-keys a parent key whose memories were sealed with it directly, so each of them
can be forgotten alone; forgetting or deleting runs it first where it is needed.

Design: docs/design/memory-log.md ("Forgetting one memory, deleting a scope").
"""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict, MnesioError, PermissionDenied
from memories import crypto
from memories.models import (
    ErasureKind,
    ErasureRequest,
    ErasureStatus,
    LogHead,
    Memory,
    MemoryKey,
    Scope,
    ScopeKey,
    Subject,
)
from memories.selectors import memory_open, scope_memory_get

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


def _counter_lock() -> None:
    """Hold the log counter's lock until the transaction ends: no append runs (nor wraps keys) meanwhile."""
    list(LogHead.objects.select_for_update().filter(pk=1).values_list("pk", flat=True))


# ---------------------------------------------------------------------------
# Backfill: own keys for memories appended before memories had them
# ---------------------------------------------------------------------------
@sensitive_variables()
def _parent_rekey(*, parent: Subject | ScopeKey, legacy: list[Memory], owned: list[MemoryKey], aad: bytes) -> int:
    """Give ``legacy`` rows own keys (with resealed copies), re-wrap ``owned`` keys, replace the parent key."""
    old_key = crypto.unwrap(bytes(parent.wrapped_key), wrapped_by=parent.wrapped_by, aad=aad)
    new_key = crypto.new_data_key()
    rows = []
    for memory in legacy:
        where = {"seq": memory.seq, "scope_id": memory.scope_id, "subject_id": memory.subject_id}
        try:
            text = crypto.unseal(old_key, memory.nonce, memory.ciphertext, aad=crypto.memory_aad(**where))
        except crypto.InvalidTag:
            raise Conflict(
                f"memory seq={memory.seq} failed authentication while its key was backfilled; nothing was changed",
                extra={"seq": memory.seq},
            ) from None
        memory_key = crypto.new_data_key()
        rows.append(MemoryKey(
            memory_id=memory.seq,
            wrapped_key=crypto.seal_box(new_key, memory_key, aad=crypto.memory_key_aad(**where)),
            resealed=crypto.seal_box(memory_key, text, aad=crypto.memory_resealed_aad(**where)),
        ))
    MemoryKey.objects.bulk_create(rows)
    for own in owned:
        memory = own.memory
        aad_key = crypto.memory_key_aad(seq=memory.seq, scope_id=memory.scope_id, subject_id=memory.subject_id)
        memory_key = crypto.open_box(old_key, own.wrapped_key, aad=aad_key)
        MemoryKey.objects.filter(pk=own.pk)._privileged_update(
            wrapped_key=crypto.seal_box(new_key, memory_key, aad=aad_key), key_generation=own.key_generation + 1
        )
    wrapped, kid = crypto.wrap(new_key, aad=aad)
    type(parent).objects.filter(pk=parent.pk)._privileged_update(
        wrapped_key=wrapped, wrapped_by=kid, key_generation=parent.key_generation + 1
    )
    return len(rows)


def memory_keys_backfill_parent(*, subject: Subject | None = None, scope: Scope | None = None) -> int:
    """Re-key one parent (a subject, or a scope's key for its memories without a subject) that seals legacy
    memories; return how many memories got own keys (0: nothing to do). Runs under the counter lock."""
    assert (subject is None) != (scope is None)
    with transaction.atomic():
        _counter_lock()
        if subject is not None:
            parent = Subject.objects.select_for_update().filter(pk=subject.pk).first()
            if parent is None or parent.is_shredded:
                return 0
            legacy = Memory.objects.filter(subject=parent, own_key__isnull=True)
            owned = MemoryKey.objects.filter(memory__subject=parent, shredded_at__isnull=True)
            aad = crypto.subject_key_aad(parent.external_id, parent.scope_id)
        else:
            parent = ScopeKey.objects.select_for_update().filter(scope=scope).first()
            if parent is None or parent.is_shredded:
                return 0
            legacy = Memory.objects.filter(scope=scope, subject__isnull=True, own_key__isnull=True)
            owned = MemoryKey.objects.filter(memory__scope=scope, memory__subject__isnull=True, shredded_at__isnull=True)
            aad = crypto.scope_key_aad(scope.pk)
        legacy_rows = list(legacy.order_by("seq"))
        if not legacy_rows:
            return 0
        num = _parent_rekey(
            parent=parent, legacy=legacy_rows, owned=list(owned.select_for_update(of=("self",)).select_related("memory")),
            aad=aad,
        )
    logger.info("memory keys backfilled num=%s parent=%s:%s", num, "subject" if subject else "scope",
                subject.pk if subject else scope.pk)
    return num


def memory_keys_backfill(*, scope: Scope | None = None) -> int:
    """Give every legacy memory (of ``scope``, or everywhere) an own key; return how many got one. Safe to repeat."""
    legacy = Memory.objects.filter(own_key__isnull=True)
    if scope is not None:
        legacy = legacy.filter(scope=scope)
    num = 0
    for subject_id in sorted(set(legacy.exclude(subject__isnull=True).values_list("subject_id", flat=True))):
        num += memory_keys_backfill_parent(subject=Subject.objects.get(pk=subject_id))
    for scope_id in sorted(set(legacy.filter(subject__isnull=True).values_list("scope_id", flat=True))):
        num += memory_keys_backfill_parent(scope=Scope.objects.get(pk=scope_id))
    return num


# ---------------------------------------------------------------------------
# Shreds (called by the erasure processing, memories.services.erasure)
# ---------------------------------------------------------------------------
def memory_key_shred(*, memory: Memory) -> bool:
    """Destroy one memory's own key (and a resealed copy) for good; True if this call shredded it.

    A legacy memory is given its own key first (its parent is re-keyed), so the shred forgets it alone.
    """
    if not MemoryKey.objects.filter(memory_id=memory.seq).exists():
        if memory.subject_id is not None:
            memory_keys_backfill_parent(subject=memory.subject)
        else:
            memory_keys_backfill_parent(scope=memory.scope)
    shredded = MemoryKey.objects.filter(memory_id=memory.seq, shredded_at__isnull=True)._privileged_update(
        wrapped_key=None, resealed=None, shredded_at=timezone.now()
    )
    if shredded:
        logger.info("memory key shredded seq=%s", memory.seq)
    return bool(shredded)


def scope_keys_shred(*, scope: Scope) -> int:
    """Destroy every key that opens the scope's memories: own keys, its subjects' and its scope key.

    Legacy memories of legacy global subjects (which also reach other scopes) get own keys first, which
    are shredded with the rest; the global subject itself is left to other scopes. Returns the own keys shredded.
    """
    legacy_subjects = set(
        Memory.objects.filter(scope=scope, own_key__isnull=True, subject__scope__isnull=True)
        .exclude(subject__isnull=True).values_list("subject_id", flat=True)
    )
    for subject_id in sorted(legacy_subjects):
        memory_keys_backfill_parent(subject=Subject.objects.get(pk=subject_id))
    now = timezone.now()
    with transaction.atomic():
        # one order of locks everywhere: the counter, subjects, own keys (a compile's store locks subjects, then keys)
        _counter_lock()
        Subject.objects.filter(scope=scope, shredded_at__isnull=True)._privileged_update(wrapped_key=None, shredded_at=now)
        num = MemoryKey.objects.filter(memory__scope=scope, shredded_at__isnull=True)._privileged_update(
            wrapped_key=None, resealed=None, shredded_at=now
        )
        ScopeKey.objects.filter(scope=scope, shredded_at__isnull=True)._privileged_update(wrapped_key=None, shredded_at=now)
    logger.info("scope keys shredded scope_id=%s own_keys=%s", scope.pk, num)
    return num


# ---------------------------------------------------------------------------
# Filing
# ---------------------------------------------------------------------------
def memory_forget_file(*, scope: Scope, seq: int, requested_by, reason: str = "forget this memory") -> ErasureRequest:
    """Forget the scope's memory at ``seq``: shred its own key now and file the erasure that rebuilds the views.

    404 naming `seq` for a seq that is not this scope's (another scope's memory looks like none). Forgetting it
    again returns the first request; a memory erased with its subject is a 409.
    """
    from .erasure import _event_record, erasure_request_shred  # erasure imports this module

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
            _event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
    except IntegrityError:  # a concurrent forget of the same memory filed first (one request per memory)
        return ErasureRequest.objects.get(kind=ErasureKind.MEMORY, memory_id=memory.seq)
    erasure_request_shred(erasure_request=erasure_request, actor=requested_by)
    logger.info("memory forget filed id=%s seq=%s", erasure_request.pk, memory.seq)
    return erasure_request


def scope_delete_file(*, scope: Scope, requested_by, reason: str = "delete this scope") -> ErasureRequest:
    """Delete ``scope``: mark it deleted, shred every key of its memories now, and file the erasure that
    destroys its cartridges. Needs ``memories.delete_scope`` (403 naming it); safe to repeat."""
    from .erasure import _event_record, erasure_request_shred

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
            _counter_lock()  # an append in flight commits first (its memory is shredded below) or sees the deletion
            Scope.objects.filter(pk=scope.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())
            erasure_request = ErasureRequest.objects.create(
                kind=ErasureKind.SCOPE, scope=scope, requested_by=requested_by, reason=reason
            )
            _event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
    except IntegrityError:  # a concurrent deletion of the same scope filed first
        return ErasureRequest.objects.get(kind=ErasureKind.SCOPE, scope=scope)
    erasure_request_shred(erasure_request=erasure_request, actor=requested_by)
    logger.info("scope deleted scope_id=%s erasure_request=%s", scope.pk, erasure_request.pk)
    return erasure_request
