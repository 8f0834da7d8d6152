"""Shredding keys for good: a subject's key, one memory's own key, every key of a scope.

A shred is a one-way UPDATE the key tables' triggers allow (the bytes become NULL); the log rows stay and
open as erased. The erasure processing calls these (services/erasure.py) under the log counter's lock.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from memories.models import Memory, MemoryKey, Scope, ScopeKey, Subject

from .backfill import memory_keys_backfill_parent
from .locks import log_counter_lock

logger = logging.getLogger("memories")


def subject_shred(*, subject: Subject) -> bool:
    """Destroy the subject's key material for good (one way); True if this call shredded it."""
    now = timezone.now()
    shredded = Subject.objects.filter(pk=subject.pk, shredded_at__isnull=True)._privileged_update(
        wrapped_key=None, shredded_at=now
    )
    subject.refresh_from_db(fields=["wrapped_key", "shredded_at"])
    if shredded:
        logger.info("subject shredded subject_id=%s", subject.pk)
    return bool(shredded)


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
        log_counter_lock()
        Subject.objects.filter(scope=scope, shredded_at__isnull=True)._privileged_update(wrapped_key=None, shredded_at=now)
        num = MemoryKey.objects.filter(memory__scope=scope, shredded_at__isnull=True)._privileged_update(
            wrapped_key=None, resealed=None, shredded_at=now
        )
        ScopeKey.objects.filter(scope=scope, shredded_at__isnull=True)._privileged_update(wrapped_key=None, shredded_at=now)
    logger.info("scope keys shredded scope_id=%s own_keys=%s", scope.pk, num)
    return num
