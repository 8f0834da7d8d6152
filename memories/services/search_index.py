"""Writes to the search index (memories.search_index) besides appends': an erasure's deletions, the backfill."""
from __future__ import annotations

import logging

from django.db import transaction

from memories import search_index
from memories.models import (
    SEARCH_TOKENIZER,
    ErasureKind,
    ErasureRequest,
    Memory,
    MemoryKey,
    Scope,
    SearchIndex,
    Subject,
)
from memories.selectors import erasure_request_memories, memories_open, scope_memories

from .locks import log_counter_lock

logger = logging.getLogger("memories")

BACKFILL_BATCH = 500  # memories opened and indexed per transaction (the log counter is locked meanwhile)


def search_index_erase(*, erasure_request: ErasureRequest) -> int:
    """Take what ``erasure_request`` erases out of the search index (a scope's: everything, and its index key).

    Called in the transaction that records the request's keys shredded, so no search after that commit, in any
    process, reads the erased memories' terms. Returns how many memories left the index.
    """
    if erasure_request.kind == ErasureKind.SCOPE:
        num = search_index.memories_unindex(scope=erasure_request.scope)
    else:
        seqs = erasure_request_memories(erasure_request=erasure_request).values_list("seq", flat=True)
        num = search_index.memories_unindex(seqs=list(seqs))
    logger.info("search index erased id=%s memories=%s", erasure_request.pk, num)
    return num


def _index_pending(scope: Scope, after: int) -> tuple[int, int] | None:
    """Index up to BACKFILL_BATCH of the scope's unindexed memories past seq ``after``; return (indexed, last seq
    looked at), or None when none is left. Erased memories are looked at and never indexed. In the caller's
    transaction, which holds the counter lock."""
    pending = Memory.objects.filter(scope=scope, seq__gt=after, search_document__isnull=True).order_by("seq")
    seqs = list(pending.values_list("seq", flat=True)[:BACKFILL_BATCH])
    if not seqs:
        return None
    # a shred of these keys either committed before (the memory opens as erased and is skipped) or waits for
    # this commit, after which its erasure deletes what was indexed here; subjects before own keys, the order
    # of every other lock of both (a compile's store, the scope's shred)
    subject_ids = set(Memory.objects.filter(seq__in=seqs).exclude(subject=None).values_list("subject_id", flat=True))
    list(Subject.objects.select_for_update().filter(pk__in=subject_ids).order_by("pk").values_list("pk"))
    list(MemoryKey.objects.select_for_update().filter(memory_id__in=seqs).order_by("memory_id").values_list("pk"))
    rows = list(scope_memories(scope=scope).filter(seq__in=seqs))
    opened = [m for m in memories_open(rows) if not m.erased and m.text is not None]
    search_index.documents_index(scope_id=scope.pk, texts=[
        search_index.IndexedText(m.seq, m.subject_id, m.created_at, m.text) for m in opened
    ])
    return len(opened), seqs[-1]


def _locked_live(scope: Scope) -> bool:
    """Take the counter lock (it orders this against appends, which index their own rows, and a scope's deletion);
    whether the scope is still live."""
    log_counter_lock()
    return Scope.objects.filter(pk=scope.pk, deleted_at__isnull=True).exists()


def _backfill_batch(scope: Scope, after: int) -> tuple[int, int] | None:
    """One transaction of the backfill (_index_pending)."""
    with transaction.atomic():
        return _index_pending(scope, after) if _locked_live(scope) else None


def _rebuild(scope: Scope) -> int:
    """Index the scope again if its index has an older tokenizer; return how many memories were indexed.

    One transaction: a search reads the old index or the new one, never part of one; appends wait meanwhile.
    """
    with transaction.atomic():
        if not _locked_live(scope):
            return 0
        old = SearchIndex.objects.filter(scope=scope, wrapped_key__isnull=False).exclude(tokenizer=SEARCH_TOKENIZER)
        if not old.exists():
            return 0
        search_index.index_reset(scope_id=scope.pk)
        num, after = 0, 0
        while (done := _index_pending(scope, after)) is not None:
            num += done[0]
            after = done[1]
    logger.info("search index rebuilt scope=%s memories=%s", scope.pk, num)
    return num


def search_index_backfill(*, scope: Scope | None = None) -> int:
    """Index every memory not in the search index yet (of ``scope``, or of every live scope), and rebuild each
    index built with an older tokenizer (SearchIndex.tokenizer); return how many memories were indexed.

    For memories appended before the index existed, and indexes from before stemming; appends index their own
    rows. Safe to repeat and to run beside appends and erasures.
    """
    scopes = [scope] if scope is not None else list(Scope.objects.filter(deleted_at__isnull=True).order_by("pk"))
    num = 0
    for each in scopes:
        num += _rebuild(each)
        after = 0
        while (done := _backfill_batch(each, after)) is not None:
            num += done[0]
            after = done[1]
    if num:
        logger.info("search index backfilled memories=%s", num)
    return num
