"""Search a scope's memories: BM25 over its search index (memories.search_index), or hybrid with dense ranking."""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from core.errors import MnesioError
from memories.models import Scope

from .log import as_of_validate, memories_open, metadata_matches, scope_memories, shown, time_range_validate
from .subjects import subject_id_variants

# ---------------------------------------------------------------------------
# Search: BM25 over a scope's search index (memories.search_index), ranked in the database
# ---------------------------------------------------------------------------
# The index is kept by appends and erasures; a search ranks the postings of its query's terms (held by the process
# and checked against the database's head and generation on every search) and opens only the memories it returns. One BM25 and one tokenization for the whole project: the index scores exactly as
# kvengine.retrieval.Bm25 (bm25s), which the gate and kveval call.
MAX_SEARCH_TOP_K = 100
MAX_SEARCH_QUERY_CHARS = 2000
MAX_SEARCH_METADATA_KEYS = 20
SEARCH_RETRIEVERS = ("bm25", "hybrid")
HYBRID_BM25_DEPTH = 100  # BM25's list in the fusion holds at least this many (RRF reads ranks, deep ones weigh little)


@dataclass(frozen=True)
class SearchHit:
    """One search result: an opened (never erased) memory and its BM25 score for the query."""

    seq: int
    subject: str | None
    content: str
    created_at: dt.datetime
    metadata: dict
    score: float


@dataclass(frozen=True)
class RankedMemory:
    """A memory that matches a query (memory_search): its seq and BM25 score."""

    seq: int
    score: float


@dataclass(frozen=True)
class SearchResult:
    """The hits, best first, and the scope head the search read (pass it back as ``as_of`` to repeat it)."""

    as_of: int
    hits: list[SearchHit]
    retriever: str = "bm25"  # what ranked them (search_retriever)


def _search_query_validate(query: object) -> str:
    from kvengine.retrieval import bm25_tokenize  # no torch: the retrieval module imports bm25s only when indexing

    if not isinstance(query, str) or not bm25_tokenize(query):
        raise MnesioError(
            f"`query` has to contain at least one word (letters or digits) but got {shown(query)}",
            extra={"field": "query"},
        )
    return query


def _top_k_validate(top_k: object, *, field: str) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_SEARCH_TOP_K:
        raise MnesioError(
            f"`{field}` has to be an integer from 1 to {MAX_SEARCH_TOP_K} but got {shown(top_k)}", extra={"field": field}
        )
    return top_k


def search_retriever(retriever: str | None = None) -> str:
    """The retriever a search uses: ``retriever``, else MNESIO_SEARCH_RETRIEVER; always `bm25` in a model-free web
    process (MNESIO_WEB_LOADS_MODEL=false), which never loads the dense encoder."""
    from django.conf import settings

    if retriever is not None and retriever not in SEARCH_RETRIEVERS:
        raise MnesioError(f"`retriever` has to be one of {list(SEARCH_RETRIEVERS)} but got {shown(retriever)}",
                          extra={"field": "retriever"})
    chosen = retriever or settings.MNESIO_SEARCH_RETRIEVER
    return chosen if chosen == "bm25" or settings.MNESIO_WEB_LOADS_MODEL else "bm25"


def _rank(*, scope: Scope, key: bytes | None, query: str, limit: int, retriever: str, **filters):
    """search_index.rank, or under `hybrid` its BM25 ranking fused by reciprocal rank (kvengine.retrieval's RRF)
    with the dense ranking of its candidates (memories.search_dense); a hit's score is then the fused score."""
    from memories import search_index

    if retriever == "bm25":
        return search_index.rank(scope=scope, key=key, query=query, limit=limit, **filters)
    from django.conf import settings

    from kvengine.retrieval import rrf_scores
    from memories.search_dense import dense_ranking

    page = search_index.rank(scope=scope, key=key, query=query, limit=max(limit, HYBRID_BM25_DEPTH),
                             candidates=settings.MNESIO_SEARCH_DENSE_WINDOW, **filters)
    dense = dense_ranking(scope=scope, query=query, seqs=page.candidates, generation=page.generation)
    fused = rrf_scores([[r.seq for r in page.ranked], dense])
    best = sorted(fused, key=lambda seq: (-fused[seq], seq))[:limit]
    return search_index.RankedPage(head=page.head, ranked=[search_index.Ranked(seq, fused[seq]) for seq in best])


def memory_search(*, scope: Scope, query: str, k: int, retriever: str = "bm25") -> list[RankedMemory]:
    """The seqs of the ``k`` memories of ``scope`` that best match ``query``, best first (equal scores: the earlier
    first); ``sorted(r.seq for r in ...)`` is their log order. By BM25 unless ``retriever="hybrid"`` (routed answers
    take BM25's top k; the search API follows MNESIO_SEARCH_RETRIEVER): opens nothing, one query once this process
    holds the terms' postings up to the scope's head, one more to read what it lacks; `hybrid` also opens and
    embeds the candidates this process has not embedded yet (search_retriever: never in a model-free web process).

    Erased memories are not in the index once their erasure's shred step has committed; a caller that opens
    the rows still checks each for ``erased`` (a forget in flight between its shred and that commit).
    """
    from memories import search_index

    query = _search_query_validate(query)
    k = _top_k_validate(k, field="k")
    retriever = search_retriever(retriever)
    key = search_index.index_key_for_read(scope=scope)
    page = _rank(scope=scope, key=key, query=query, limit=k, retriever=retriever)
    return [RankedMemory(r.seq, r.score) for r in page.ranked]


def memories_search(
    *,
    scope: Scope,
    query: str,
    top_k: int = 10,
    subject: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    as_of: int | None = None,
    metadata: dict | None = None,
    retriever: str | None = None,
) -> SearchResult:
    """Return the scope's memories that best match ``query`` by BM25 (or `hybrid`: search_retriever), best first,
    at most ``top_k``.

    Filters: ``subject`` (external id), ``since <= created_at < until``, ``seq <= as_of`` (default: the
    scope's head, read by the same statement as the statistics, so the reported ``as_of`` is exactly what was
    ranked), and ``metadata`` (exact match on each given top-level key). BM25's statistics are the scope's as
    of ``as_of``: the other filters choose among its memories without changing them (as a filter does in
    Lucene). Metadata is sealed, so it is checked on the ranked memories as they are opened (more are ranked
    until ``top_k`` match or none is left).
    Erased memories are never returned: they leave the index with their erasure, and any that opens as
    erased is dropped. Only ``scope``'s rows are read. Raises naming the field.
    """
    from memories import search_index

    query = _search_query_validate(query)
    top_k = _top_k_validate(top_k, field="top_k")
    time_range_validate(since=since, until=until)
    if as_of is not None:
        as_of = as_of_validate(as_of, scope=scope)
    retriever = search_retriever(retriever)
    key = search_index.index_key_for_read(scope=scope)
    wanted = subject_id_variants(subject) if subject is not None else None
    limit = top_k if not metadata else max(4 * top_k, 50)
    seen: set[int] = set()
    hits: list[SearchHit] = []
    while True:
        page = _rank(
            scope=scope, key=key, query=query, limit=limit, subject_ids_of=wanted, since=since, until=until, as_of=as_of,
            retriever=retriever,
        )
        fresh = [r for r in page.ranked if r.seq not in seen]
        seen.update(r.seq for r in fresh)
        if fresh:
            # scope_memories() says what memories_open needs joined; all of it but the scope: every row shares the
            # caller's ``scope`` instead (joining it builds a Scope and a ScopeKey per row)
            rows = scope_memories(scope=scope)
            joined = [name for name in rows.query.select_related if name != "scope"]
            by_seq = {row.seq: row for row in rows.select_related(None).select_related(*joined).filter(
                seq__in=[r.seq for r in fresh]
            )}
            for row in by_seq.values():
                row.scope = scope
            opened = {m.seq: m for m in memories_open(by_seq.values())}
            for r in fresh:
                memory = opened.get(r.seq)
                if memory is None or memory.erased or memory.text is None:
                    continue
                if metadata and not metadata_matches(memory.metadata or {}, metadata):
                    continue
                hits.append(SearchHit(
                    seq=memory.seq, subject=memory.subject, content=memory.text, created_at=memory.created_at,
                    metadata=dict(memory.metadata or {}), score=r.score,
                ))
                if len(hits) == top_k:
                    break
        if not metadata or len(hits) == top_k or len(page.ranked) < limit:
            return SearchResult(as_of=page.head if as_of is None else as_of, hits=hits, retriever=retriever)
        limit *= 4
