"""Appends to the log: one sealed row (and its own key) per memory, seqs without gaps, idempotency keys honoured.

One code path: ``memory_append`` is ``memories_append_batch`` with one item (and the error fields of a
single append: ``content``, not ``items[0].content``). A batch is all or nothing: every item is validated
first and any bad one writes nothing, the error listing each by path. The counter row, moved and locked in
one UPDATE, gives a batch consecutive seqs visible in commit order. Idempotency keys are caught by the
unique constraint, not looked up first: the transaction rolls back and a second attempt answers the repeats.
The common path is 4 statements per transaction (5 with subjects) whatever the batch size.

Design: docs/design/appends.md.
"""
from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict, MnesioError, NotFound
from memories import crypto, registry, search_index
from memories.models import Memory, MemoryKey, Scope, ScopeKey, Subject
from memories.selectors import subject_id_variants

from .append_items import AppendItem, batch_failure, existing_check, items_validate, repeat_errors
from .locks import log_counter_advance

logger = logging.getLogger("memories")

# How often an append runs again after losing an idempotency key to a concurrent commit (it then finds it).
_MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class AppendOutcome:
    """What happened to one item: its row, and whether this call created it (False: the key was seen)."""

    memory: Memory
    created: bool


def _scope_locked_view(scope: Scope) -> Scope:
    """Re-read the scope and its key after the counter lock: a deletion committed meanwhile is seen here.

    ``scope_delete_file`` takes the counter lock too, so a deletion and an append are ordered.
    """
    fresh = Scope.objects.select_related("key").filter(pk=scope.pk).first()
    if fresh is None or fresh.deleted_at is not None:
        raise NotFound(f"`scope` '{scope.name}' does not exist or is not granted to you", extra={"field": "scope"})
    return fresh


@sensitive_variables()
def _scope_parent_key(scope: Scope) -> tuple[ScopeKey, bytes]:
    """The scope's key row and data key (the parent of its memories' own keys without a subject), created on
    first use."""
    aad = crypto.scope_key_aad(scope.pk)
    row = getattr(scope, "key", None)  # a missing reverse one-to-one raises an AttributeError subclass
    if row is None:
        data_key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(data_key, aad=aad)
        row = ScopeKey.objects.create(scope=scope, wrapped_key=wrapped, wrapped_by=kid)
        return row, data_key
    return row, crypto.unwrap(row.wrapped_key, wrapped_by=row.wrapped_by, aad=aad)


@dataclass(frozen=True)
class _ScopeKeyCached:
    """A scope's key row and data key as this process last read them; valid while the row's bytes are the same."""

    row: ScopeKey
    wrapped: bytes
    data_key: bytes
    master_key_ids: frozenset[str]  # the master keys configured when it was read: another set reads it again


# scope id -> its key as last read (PostgreSQL only). The INSERT checks, in the same statement and under the
# counter lock, that the scope is not deleted and its key row still holds exactly these bytes (a re-key, a
# re-wrap, a shred or a reused id changes them), so a stale entry is never used; it only saves the re-read.
# Holding data keys in memory adds nothing an attacker of this process lacks: the master key is here too.
_scope_keys: dict[int, _ScopeKeyCached] = {}


class _ScopeChanged(Exception):
    """The guarded INSERT found the scope deleted or its key changed: read it again (nothing was written)."""


@sensitive_variables()
def _subjects_resolve(scope: Scope, items: list[AppendItem]) -> tuple[dict[str, Subject], dict[int, bytes], list[tuple[int, MnesioError]]]:
    """The scope's subject row for each external id of the batch, created on its first memory, and their keys.

    Subject rows are locked until the append commits: a shred (an UPDATE of the row) then either comes first
    and is seen here (409 for its items), or waits for the append, whose memories the erasure's rebuild then
    finds. Only this scope's subjects (and legacy global ones with memories here) are looked at, so the
    answer says nothing about the same id in scopes the caller may not be granted. A shredded subject stays
    shredded: its items are refused (a new person needs a new subject id).
    """
    wanted = sorted({item.subject for item in items if item.subject is not None})
    if not wanted:
        return {}, {}, []
    variants = sorted({v for external_id in wanted for v in subject_id_variants(external_id)})
    rows = Subject.objects.select_for_update().filter(scope=scope, external_id__in=variants).order_by("pk")
    by_id: dict[str, Subject] = {}
    for row in rows:
        by_id.setdefault(unicodedata.normalize("NFC", row.external_id), row)
    missing = [external_id for external_id in wanted if external_id not in by_id]
    if missing:
        # an erased legacy subject of this scope stays erased here (the 409 below)
        legacy = Subject.objects.filter(
            scope__isnull=True, external_id__in=[v for m in missing for v in subject_id_variants(m)],
            memories__scope=scope, shredded_at__isnull=False,
        ).distinct()
        for row in legacy:
            by_id.setdefault(unicodedata.normalize("NFC", row.external_id), row)
    keys: dict[int, bytes] = {}
    new_rows = []
    for external_id in wanted:
        if external_id in by_id:
            continue
        data_key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(data_key, aad=crypto.subject_key_aad(external_id, scope.pk))
        row = Subject(scope=scope, external_id=external_id, wrapped_key=wrapped, wrapped_by=kid)
        row._new_data_key = data_key  # type: ignore[attr-defined]
        new_rows.append(row)
        by_id[external_id] = row
    if new_rows:
        Subject.objects.bulk_create(new_rows)
        for row in new_rows:
            keys[row.pk] = row.__dict__.pop("_new_data_key")
    errors = []
    for item in items:
        row = by_id.get(item.subject) if item.subject is not None else None
        if row is not None and row.is_shredded:
            errors.append((item.index, Conflict(
                f"`subject` '{item.subject}' was erased at {row.shredded_at.isoformat()}; its key is destroyed and "
                "new memories for it are refused. Use a new subject id for a new person.",
                extra={"field": "subject", "shredded_at": row.shredded_at.isoformat()},
            )))
        elif row is not None and row.pk not in keys:
            keys[row.pk] = crypto.unwrap(
                row.wrapped_key, wrapped_by=row.wrapped_by, aad=crypto.subject_key_aad(row.external_id, row.scope_id)
            )
    return by_id, keys, errors


@sensitive_variables()
def _rows_build(scope: Scope, items: list[AppendItem], head: int, subjects: dict[str, Subject], keys: dict[int, bytes],
                scope_key: bytes | None) -> tuple[list[Memory], list[MemoryKey]]:
    """Seal each new item under a fresh own key, wrapped by its parent's key; seqs ``head - n + 1 .. head``."""
    memories, own_keys = [], []
    seq = head - len(items)
    for item in items:
        seq += 1
        subject = subjects[item.subject] if item.subject is not None else None
        subject_id = subject.pk if subject is not None else None
        parent = keys[subject.pk] if subject is not None else scope_key
        assert parent is not None
        memory_key = crypto.new_data_key()
        nonce, ciphertext = crypto.seal(
            memory_key, item.data, aad=crypto.memory_aad(seq=seq, scope_id=scope.pk, subject_id=subject_id)
        )
        metadata_box = None
        if item.metadata is not None:
            metadata_box = crypto.seal_box(
                memory_key, item.metadata, aad=crypto.memory_metadata_aad(seq=seq, scope_id=scope.pk, subject_id=subject_id)
            )
        memories.append(Memory(
            seq=seq, scope=scope, subject=subject, idempotency_key=item.idempotency_key, nonce=nonce,
            ciphertext=ciphertext, metadata_box=metadata_box,
        ))
        own_keys.append(MemoryKey(
            memory_id=seq,
            wrapped_key=crypto.seal_box(
                parent, memory_key, aad=crypto.memory_key_aad(seq=seq, scope_id=scope.pk, subject_id=subject_id)
            ),
        ))
    return memories, own_keys


def _rows_insert(memories: list[Memory], own_keys: list[MemoryKey], *, guard: tuple[int, bytes | None] | None = None) -> None:
    """Insert the memories and their own keys: on PostgreSQL in one statement (one round trip), else two.

    One array parameter per column (``unnest``), not one placeholder per value: a 500-row batch is a short
    statement with 12 parameters, which the driver does not have to split and quote value by value. The memory
    key's foreign key to its memory is checked at commit (Django creates it deferrable), so both inserts may
    share one statement.
    """
    if connection.vendor != "postgresql":
        Memory.objects.bulk_create(memories)
        MemoryKey.objects.bulk_create(own_keys)
        return
    now = timezone.now()
    where, where_params = "", []
    if guard is not None:
        # the scope is live (and its key the one we used) at this statement, which runs under the counter lock
        # that a deletion, a re-key and a shred take too: nothing can change it between here and our commit
        scope_id, wrapped = guard
        where = " WHERE EXISTS (SELECT 1 FROM memories_scope s WHERE s.id = %s AND s.deleted_at IS NULL)"
        where_params = [scope_id]
        if wrapped is not None:
            where += " AND EXISTS (SELECT 1 FROM memories_scopekey k WHERE k.scope_id = %s AND k.wrapped_key = %s)"
            where_params += [scope_id, wrapped]
    sql = (
        f"WITH inserted_keys AS (INSERT INTO {MemoryKey._meta.db_table} (seq, wrapped_key, key_generation, created_at) "
        "SELECT k.seq, k.wrapped_key, 1, %s FROM unnest(%s::bigint[], %s::bytea[]) AS k(seq, wrapped_key)"
        f"{where} RETURNING seq) "
        f"INSERT INTO {Memory._meta.db_table} "
        "(seq, scope_id, subject_id, created_at, idempotency_key, nonce, ciphertext, metadata_box) "
        "SELECT m.seq, %s, m.subject_id, %s, m.idempotency_key, m.nonce, m.ciphertext, m.metadata_box "
        "FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::bytea[], %s::bytea[], %s::bytea[]) "
        f"AS m(seq, subject_id, idempotency_key, nonce, ciphertext, metadata_box){where} RETURNING id, seq"
    )
    params = [
        now, [k.memory_id for k in own_keys], [k.wrapped_key for k in own_keys], *where_params,
        memories[0].scope_id, now,
        [m.seq for m in memories], [m.subject_id for m in memories], [m.idempotency_key for m in memories],
        [m.nonce for m in memories], [m.ciphertext for m in memories], [m.metadata_box for m in memories],
        *where_params,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = {seq: pk for pk, seq in cursor.fetchall()}
    if len(ids) != len(memories):
        raise _ScopeChanged
    for memory, own in zip(memories, own_keys, strict=True):
        memory.pk = ids[memory.seq]
        memory.created_at = own.created_at = now
        memory._state.adding = own._state.adding = False
        memory._state.db = own._state.db = connection.alias


def _append_once(scope: Scope, items: list[AppendItem], *, single: bool, check_keys: bool, reread: bool = False) -> list[AppendOutcome]:
    """One attempt, in one transaction: (check keys,) take seqs, resolve keys, insert; all or nothing."""
    with transaction.atomic():
        existing = existing_check(scope, items) if check_keys else {}
        new_items = [i for i in items if i.first is None and (i.idempotency_key is None or i.idempotency_key not in existing)]
        errors = repeat_errors(items, existing)
        if errors:
            raise batch_failure(errors, single=single)
        created: dict[int, Memory] = {}
        if new_items:
            head = log_counter_advance(len(new_items))
            need_scope_key = any(i.subject is None for i in new_items)
            cached = _scope_keys.get(scope.pk) if connection.vendor == "postgresql" else None
            known = frozenset(crypto.known_master_keys())
            if cached is not None and cached.master_key_ids != known:
                cached = None  # a process whose master key changed proves it can still open the key (or refuses)
            guard = None
            if connection.vendor == "postgresql" and not reread and (cached is not None or not need_scope_key):
                # no re-read of the scope: the INSERT itself checks it (one round trip less)
                guard = (scope.pk, cached.wrapped if need_scope_key else None)
                scope_key = cached.data_key if need_scope_key else None
                if need_scope_key:
                    scope.key = cached.row  # what reading the results back uses
            else:
                scope = _scope_locked_view(scope)
                scope_key = None
                if need_scope_key:
                    row, scope_key = _scope_parent_key(scope)
                    _scope_keys[scope.pk] = _ScopeKeyCached(row, bytes(row.wrapped_key), scope_key, known)
            subjects, keys, errors = _subjects_resolve(scope, new_items)
            if errors:
                raise batch_failure(errors, single=single)
            memories, own_keys = _rows_build(scope, new_items, head, subjects, keys, scope_key)
            _rows_insert(memories, own_keys, guard=guard)
            search_index.memories_index(memories=memories, texts=[item.data.decode() for item in new_items])
            for memory, own in zip(memories, own_keys, strict=True):
                memory.own_key = own  # cached: reading the results back needs no query per row
            created = {item.index: memory for item, memory in zip(new_items, memories, strict=True)}
    outcomes: list[AppendOutcome] = []
    for item in items:
        if item.index in created:
            outcomes.append(AppendOutcome(created[item.index], True))
        elif item.first is not None:
            outcomes.append(AppendOutcome(outcomes[item.first].memory, False))  # items[i].index == i
        else:
            outcomes.append(AppendOutcome(existing[item.idempotency_key], False))
    return outcomes


def _append(*, scope: Scope, raw_items: Iterable[Mapping[str, Any]], single: bool, actor=None) -> list[AppendOutcome]:
    items = items_validate(list(raw_items), single=single)
    keyed = any(i.idempotency_key is not None for i in items)
    reread = False
    for attempt in range(1, _MAX_ATTEMPTS + 1):
        try:
            # the first attempt inserts without looking the keys up (one round trip less: a key seen before
            # is the rare case, a retry); the unique constraint catches a repeat, and the next attempt checks
            outcomes = _append_once(scope, items, single=single, check_keys=attempt > 1 and not reread, reread=reread)
            break
        except _ScopeChanged:
            # deleted, re-keyed or re-wrapped since this process cached its key: nothing was written; the next
            # attempt reads the scope again (and answers 404 if it was deleted)
            _scope_keys.pop(scope.pk, None)
            reread = True
            if attempt == _MAX_ATTEMPTS:
                raise Conflict("the scope changed during each attempt of this append; send it again",
                               extra={"field": "scope"}) from None
        except IntegrityError:
            # a key of ours was already used (or was committed concurrently after our check): nothing of ours
            # was written (seqs included); run again, and the check finds it
            if attempt == _MAX_ATTEMPTS or not keyed:
                raise
    num_created = sum(o.created for o in outcomes)
    if num_created:
        seqs = [o.memory.seq for o in outcomes if o.created]
        logger.info("memories appended num=%s seqs=%s..%s scope=%s actor=%s", num_created, seqs[0], seqs[-1],
                    scope.name, getattr(actor, "pk", None))
        _append_hooks_after_commit(scope.pk)
    return outcomes


def _append_hooks_after_commit(scope_id: int) -> None:
    """Run the registered append hooks (memories.registry) once the append commits: a view that follows the log
    (cartridges' auto-refresh) must not see a head that could still roll back. A hook that raises is logged; the
    committed append stands (``robust``)."""
    for hook in registry.append_hooks():
        transaction.on_commit(lambda hook=hook: hook(scope_id), robust=True)


def memories_append_batch(*, scope: Scope, items: Iterable[Mapping[str, Any]], actor=None) -> list[AppendOutcome]:
    """Append up to MAX_BATCH_ITEMS memories in one transaction; return one outcome per item, in order.

    Each item is a mapping with ``content`` and optional ``subject``, ``idempotency_key`` and ``metadata``.
    All or nothing: any bad item refuses the whole batch (400, or 409 when a key conflicts or a subject is
    erased), naming each bad item's field by path in ``extra.errors``. New rows get consecutive seqs in item
    order; an item whose key was seen (before, or earlier in this batch) is answered with the original row.
    """
    return _append(scope=scope, raw_items=items, single=False, actor=actor)


def memory_append(
    *,
    scope: Scope,
    subject: str | None = None,
    content: str,
    idempotency_key: str | None = None,
    metadata: dict | None = None,
    actor=None,
) -> Memory:
    """Append one memory (a batch of one), sealed with its own key, wrapped by its subject's key or the scope's.

    A repeated ``idempotency_key`` in the same scope returns the original row (``memory.appended`` is
    False) and writes nothing; a repeat with other content, subject or metadata is a 409. Seq is taken under
    the counter lock inside the same transaction as the insert, so a failed append leaves no gap.
    """
    item = {"content": content, "subject": subject, "idempotency_key": idempotency_key, "metadata": metadata}
    outcome = _append(scope=scope, raw_items=[item], single=True, actor=actor)[0]
    memory = outcome.memory
    memory.appended = outcome.created
    return memory
