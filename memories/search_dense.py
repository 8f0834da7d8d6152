"""Dense similarity for hybrid search: all-MiniLM-L6-v2 (kvengine.retrieval.DenseEncoder) embeddings of a scope's
memories, computed in this process and held only in its memory.

Nothing is stored: a forgotten memory leaves no embedding behind in the database, and the ones a process holds
are dropped with the scope's index generation (an erasure moves it): at this process's next search of the scope,
and at the start of its next request or task (``dense_purge_stale``, which cartridges.engine runs), whichever
comes first, so a deleted scope's embeddings do not wait for a search that never comes. Only the candidates the search index names
are ranked (memories.search_index.rank: indexed, so never erased, and kept by the filters); an embedding is
computed the first time a memory is a candidate in this process, from its opened text.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from memories.models import Scope, SearchIndex

_MAX_CACHED_SCOPES = 8  # a process searching more scopes embeds the least recently searched one again
OPEN_BATCH = 1000  # memories opened and embedded at a time


@dataclass
class _Held:
    generation: int
    vectors: dict[int, object] = field(default_factory=dict)  # seq -> numpy float32 [384], unit length


_held: dict[tuple[int, object], _Held] = {}
_lock = threading.Lock()  # one embedding at a time per process (the encoder is one model)
_encoder = None


def encoder():
    """The process's DenseEncoder, loaded on first use (sentence-transformers and torch: never in a model-free
    web tier, which memories.selectors.search_retriever keeps on BM25)."""
    global _encoder
    if _encoder is None:
        from kvengine.retrieval import DenseEncoder

        _encoder = DenseEncoder()
    return _encoder


def dense_ranking(*, scope: Scope, query: str, seqs: Sequence[int], generation: int) -> list[int]:
    """``seqs`` (memories of ``scope``) best first by cosine similarity to ``query``; equal ones earlier first."""
    import numpy as np

    from memories.selectors.log import memories_open, scope_memories

    if not seqs:
        return []
    cache_key = (scope.pk, scope.created_at)
    with _lock:
        held = _held.pop(cache_key, None)
        if held is None or held.generation != generation:
            held = _Held(generation)
        _held[cache_key] = held  # most recently used last
        while len(_held) > _MAX_CACHED_SCOPES:
            _held.pop(next(iter(_held)))
        missing = [seq for seq in seqs if seq not in held.vectors]
        for start in range(0, len(missing), OPEN_BATCH):
            rows = scope_memories(scope=scope).filter(seq__in=missing[start:start + OPEN_BATCH])
            opened = [m for m in memories_open(rows) if not m.erased and m.text is not None]
            if opened:
                held.vectors.update(zip([m.seq for m in opened], encoder().encode([m.text for m in opened]),
                                        strict=True))
        present = [seq for seq in seqs if seq in held.vectors]
        if not present:
            return []
        matrix = np.stack([held.vectors[seq] for seq in present])  # (num_present, 384), unit rows
        similarity = matrix @ encoder().encode([query])[0]  # (num_present,)
    order = np.lexsort((np.array(present), -similarity))
    return [present[i] for i in order]


def dense_purge_stale() -> int:
    """Drop the embeddings held for scopes whose index generation moved (an erasure) or whose key is shredded (a
    deleted scope); return how many scopes' went. One query while anything is held, none otherwise."""
    held = _held.copy()  # no lock: an embedding in progress must not hold up the start of a request
    if not held:
        return 0
    live = dict(SearchIndex.objects.filter(scope_id__in={key[0] for key in held}, shredded_at__isnull=True)
                .values_list("scope_id", "generation"))
    stale = [key for key, entry in held.items() if live.get(key[0]) != entry.generation]
    for key in stale:
        _held.pop(key, None)
    return len(stale)
