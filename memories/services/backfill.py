"""Own keys for memories appended before memories had them (the backfill).

Such memories were sealed directly with their subject's or scope's key; the log row cannot be re-sealed (it
is immutable), and shredding the parent key would erase its siblings too. ``memory_keys_backfill_parent``
re-keys such a parent: for each of its legacy memories it makes an own key and a copy of the content sealed
under it (MemoryKey.resealed), re-wraps the own keys the parent already wraps under a new parent key, and
replaces the parent key (key_generation + 1). The old parent key, the only key that opened the legacy
ciphertexts, is then gone from the database; every memory opens through its own key and can be forgotten
alone. ``manage.py memory_keys_backfill`` runs it for every parent, once after the upgrade (safe to repeat);
forgetting a legacy memory, or deleting a scope holding legacy memories, runs it for the parents concerned
first (services/shred.py), so nothing depends on the command having run.
"""
from __future__ import annotations

import logging

from django.db import transaction
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict
from memories import crypto
from memories.models import Memory, MemoryKey, Scope, ScopeKey, Subject

from .locks import log_counter_lock

logger = logging.getLogger("memories")


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
        log_counter_lock()
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
