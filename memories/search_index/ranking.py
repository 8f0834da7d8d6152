"""Ranking a scope's memories for a query: BM25 over the postings this process holds, checked against the database's
head and generation on every search (the package docstring says why)."""
from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection

from kvengine.retrieval import BM25_B, BM25_K1
from memories.models import (
    SEARCH_TOKENIZER,
    Scope,
    Subject,
)

from .keys import (
    DOCS_TABLE,
    INDEX_TABLE,
    MEMORIES_TABLE,
    POSTINGS_TABLE,
    TERMS_TABLE,
    index_tokens,
    sql_in,
    term_digest,
)

_NO_HEAD = 2**63 - 1  # as_of when none is given: every seq is at or before it
# (scope id, scope created_at) -> the tokenizer a search of the scope assumes; the search reads the index's own and
# tokenizes the query again when it differs (once after a rebuild)
_read_tokenizers: dict[tuple[int, object], int] = {}



@dataclass(frozen=True)
class Ranked:
    """One memory that matches a query: its seq and BM25 score."""

    seq: int
    score: float


@dataclass(frozen=True)
class RankedPage:
    """Ranked memories, best first (equal scores: the earlier first), and the scope head the ranking read."""

    head: int
    ranked: list[Ranked]
    # what a hybrid search re-ranks (rank(candidates=N)): the newest N indexed memories the filters keep, in log
    # order, and the index generation they are of (an erasure or rebuild moves it)
    candidates: list[int] = field(default_factory=list)
    generation: int = 0


@dataclass(frozen=True)
class _Weights:
    """What scoring needs: each query term's weight (qtf x idf), the length terms, and what the cache checks."""

    head: int
    weight: dict[int, float]
    num_documents: int
    c1: float  # k1 (1 - b)
    c2: float  # k1 b / avgdl: a term's part is weight x tf / (tf + c1 + c2 dl)
    generation: int
    tokenizer: int | None  # the index's (None: the scope has no index row)


def weights_statement(scope: Scope, counts: Counter[int], as_of: int) -> tuple[str, list]:
    """The scope's head, totals and generation (kind 0, 2), and the query terms' document frequencies (kind 1), as
    of ``as_of`` (the memories appended after it are few, and their counts are taken off). Rows of _ROW's shape."""
    terms, term_params = sql_in("t.term", list(counts))
    sql = (
        f"SELECT 0, i.generation, i.num_documents - (SELECT count(*) FROM {DOCS_TABLE} d WHERE d.scope_id = %s "
        f"AND d.seq > %s), CAST(NULL AS timestamp with time zone), i.total_length - (SELECT coalesce(sum(d.length), 0) FROM {DOCS_TABLE} d "
        f"WHERE d.scope_id = %s AND d.seq > %s), i.tokenizer FROM {INDEX_TABLE} i WHERE i.scope_id = %s "
        f"UNION ALL SELECT 1, t.term, t.df - (SELECT count(*) FROM {POSTINGS_TABLE} p WHERE p.scope_id = t.scope_id "
        f"AND p.term = t.term AND p.seq > %s), CAST(NULL AS timestamp with time zone), 0, 0 FROM {TERMS_TABLE} t WHERE t.scope_id = %s AND {terms} "
        f"UNION ALL SELECT 2, 0, max(m.seq), CAST(NULL AS timestamp with time zone), 0, 0 FROM {MEMORIES_TABLE} m WHERE m.scope_id = %s"
    )
    return sql, [scope.pk, as_of, scope.pk, as_of, scope.pk, as_of, scope.pk, *term_params, scope.pk]


def _weights(rows: list[tuple], counts: Counter[int]) -> _Weights:
    head, generation, num_documents, total_length, df, tokenizer = 0, -1, 0, 0, {}, None
    for kind, term, value, _, length, extra in rows:
        if kind == 0:
            generation, num_documents, total_length, tokenizer = int(term), int(value), int(length), int(extra)
        elif kind == 1 and value > 0:
            df[int(term)] = int(value)
        elif kind == 2:
            head = int(value or 0)
    weight = {
        term: counts[term] * math.log(1 + (num_documents - n + 0.5) / (n + 0.5)) for term, n in df.items()
    }
    avgdl = total_length / num_documents if num_documents else 1.0
    return _Weights(head, weight, num_documents, BM25_K1 * (1 - BM25_B), BM25_K1 * BM25_B / (avgdl or 1.0),
                    generation, tokenizer)


@dataclass
class _TermPostings:
    """One term's postings in this process, up to ``upto`` (a scope head): documents (indices into the scope's
    ``seqs``, ascending) and the term's count in each."""

    upto: int
    docs: object  # numpy int64
    tfs: object  # numpy float64


@dataclass
class _ScopeCache:
    """What this process holds of one scope's index, as of ``generation`` and up to ``upto``: every indexed
    memory's seq (ascending) and length, and the postings of the terms it was asked for."""

    generation: int
    upto: int
    seqs: object  # numpy int64
    lengths: object  # numpy float64
    subjects: object  # numpy int64, -1 for none: what the subject filter reads
    created: object  # numpy datetime64[us] (UTC): what the time filters read
    terms: dict[int, _TermPostings]


_MAX_CACHED_SCOPES = 16  # a process serving more scopes reads the least recently searched one again
_cache: dict[tuple[int, object], _ScopeCache] = {}
_cache_lock = threading.Lock()  # a threaded server's searches extend the same arrays: one at a time per process


def _delta_statement(scope: Scope, held: _ScopeCache, terms: Sequence[int], head: int | None) -> tuple[str, list]:
    """The documents past what ``held`` holds (kind 3), and each term's postings past what it holds of it (kind 4),
    up to ``head`` (None: the head this statement reads). Rows of _ROW's shape."""
    upto = f"(SELECT max(m.seq) FROM {MEMORIES_TABLE} m WHERE m.scope_id = %s)" if head is None else "%s"
    upto_param = scope.pk if head is None else head
    sql = (f"SELECT 3, 0, d.seq, d.created_at, d.length, coalesce(d.subject_id, -1) FROM {DOCS_TABLE} d "
           f"WHERE d.scope_id = %s AND d.seq > %s AND d.seq <= {upto}")
    params: list = [scope.pk, held.upto, upto_param]
    for term in terms:  # one index range per term (an OR of them became a bitmap scan of the table)
        sql += (" UNION ALL SELECT 4, p.term, p.seq, CAST(NULL AS timestamp with time zone), p.tf, 0 "
                f"FROM {POSTINGS_TABLE} p WHERE p.scope_id = %s AND p.term = %s AND p.seq > %s AND p.seq <= {upto}")
        params += [scope.pk, term, held.terms[term].upto if term in held.terms else 0, upto_param]
    return sql, params


def _apply(held: _ScopeCache, rows: list[tuple], terms: Sequence[int], head: int) -> None:
    """Extend ``held`` with a delta's rows (kinds 3 and 4; any others are skipped): it then holds ``terms`` up to
    ``head``."""
    import numpy as np

    docs = [row for row in rows if row[0] == 3]
    docs.sort(key=lambda row: row[2])
    postings = np.array([(row[1], row[2], row[4]) for row in rows if row[0] == 4], dtype=np.int64).reshape(-1, 3)
    held.seqs = np.concatenate([held.seqs, np.array([row[2] for row in docs], dtype=np.int64)])  # all past upto
    held.lengths = np.concatenate([held.lengths, np.array([row[4] for row in docs], dtype=np.float64)])
    held.subjects = np.concatenate([held.subjects, np.array([row[5] for row in docs], dtype=np.int64)])
    held.created = np.concatenate([held.created, np.array([_utc_naive(row[3]) for row in docs], "datetime64[us]")])
    held.upto = head
    for term in terms:
        mine = postings[postings[:, 0] == term]
        mine = mine[np.argsort(mine[:, 1], kind="stable")]
        new = _TermPostings(head, np.searchsorted(held.seqs, mine[:, 1]), mine[:, 2].astype(np.float64))
        old = held.terms.get(term)
        if old is not None:
            new = _TermPostings(head, np.concatenate([old.docs, new.docs]), np.concatenate([old.tfs, new.tfs]))
        held.terms[term] = new


def _empty(generation: int) -> _ScopeCache:
    import numpy as np

    return _ScopeCache(generation, 0, np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.int64),
                       np.zeros(0, "datetime64[us]"), {})


def _read(scope: Scope, counts: Counter[int], as_of: int) -> tuple[_Weights, _ScopeCache]:
    """The weights, and this process's copy of the scope's documents and query terms brought up to the head.

    One statement reads the weights and, past what this process holds, the documents and the terms' postings; a
    second only when the scope's generation moved since (an erasure, a backfill): the copy is then read anew.
    """
    cache_key = (scope.pk, scope.created_at)
    held = _cache.pop(cache_key, None) or _empty(-2)
    _cache[cache_key] = held  # most recently used last
    while len(_cache) > _MAX_CACHED_SCOPES:
        _cache.pop(next(iter(_cache)))
    terms = list(counts)
    weights_sql, weights_params = weights_statement(scope, counts, as_of)
    delta_sql, delta_params = _delta_statement(scope, held, terms, None)
    with connection.cursor() as cursor:
        cursor.execute(f"{weights_sql} UNION ALL {delta_sql}", [*weights_params, *delta_params])
        rows = cursor.fetchall()
    weights = _weights(rows, counts)
    if held.generation == weights.generation or (held.upto == 0 and not held.terms):  # a new copy: all of it
        held.generation = weights.generation
        _apply(held, rows, terms, weights.head)
        return weights, held
    held = _cache[cache_key] = _empty(weights.generation)
    delta_sql, delta_params = _delta_statement(scope, held, terms, weights.head)
    with connection.cursor() as cursor:
        cursor.execute(delta_sql, delta_params)
        _apply(held, cursor.fetchall(), terms, weights.head)
    return weights, held


def _utc_naive(value):
    """A stored datetime as naive UTC (numpy's datetime64 has no time zone)."""
    if isinstance(value, str):  # SQLite returns a UNION's datetimes as text
        value = datetime.fromisoformat(value)
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _kept(held: _ScopeCache, upto: int, scope: Scope, *, subject_ids_of, since, until):
    """Which of the first ``upto`` held memories the subject and time filters keep (numpy bools), or None."""
    import numpy as np

    if subject_ids_of is None and since is None and until is None:
        return None
    keep = np.ones(upto, dtype=bool)
    if subject_ids_of is not None:
        # the subject rows with these spellings: the scope's own, and legacy global ones with memories here
        ids = list(Subject.objects.filter(external_id__in=list(subject_ids_of)).values_list("pk", flat=True))
        keep &= np.isin(held.subjects[:upto], np.array(ids, dtype=np.int64))
    if since is not None:
        keep &= held.created[:upto] >= np.datetime64(_utc_naive(since), "us")
    if until is not None:
        keep &= held.created[:upto] < np.datetime64(_utc_naive(until), "us")
    return keep


def rank(*, scope: Scope, key: bytes | None, query: str, limit: int, subject_ids_of: Sequence[str] | None = None,
         since=None, until=None, as_of: int | None = None, candidates: int = 0) -> RankedPage:
    """The ``limit`` best memories of ``scope`` for ``query`` by BM25, best first (equal scores: the earlier first).

    Filters: ``subject_ids_of`` (the subject external id spellings to keep), ``since <= created_at < until``,
    ``seq <= as_of``. One statement (_read), a second after an erasure or backfill, and one for the subject rows
    of a subject filter. ``candidates``: also name the newest that many memories the filters keep, matching or not.
    """
    import numpy as np

    cache_key = (scope.pk, scope.created_at)
    tokenizer = _read_tokenizers.get(cache_key, SEARCH_TOKENIZER)
    with _cache_lock:
        for _ in range(2):  # a second time only when the index's tokenizer is not the one assumed
            counts = Counter(
                term_digest(key, token) for token in index_tokens(query, tokenizer=tokenizer)
            ) if key is not None else Counter()
            if not counts:
                counts = Counter({0: 1})  # no term (or nothing indexed): the statement still reads the head; 0 weighs 0
            weights, held = _read(scope, counts, _NO_HEAD if as_of is None else as_of)
            if weights.tokenizer is None or weights.tokenizer == tokenizer:
                break
            tokenizer = _read_tokenizers[cache_key] = weights.tokenizer
        if not weights.weight and not candidates:
            return RankedPage(head=weights.head, ranked=[], generation=weights.generation)
        upto = len(held.seqs) if as_of is None else int(np.searchsorted(held.seqs, as_of, side="right"))
        seqs = held.seqs[:upto]
        scores = np.zeros(upto, dtype=np.float64)
        for term, weight in weights.weight.items():  # term by term, as bm25s sums them
            postings = held.terms[term]
            keep = postings.docs < upto
            docs, tfs = postings.docs[keep], postings.tfs[keep]
            scores += np.bincount(docs, weight * tfs / (tfs + weights.c1 + weights.c2 * held.lengths[docs]), upto)
        kept = _kept(held, upto, scope, subject_ids_of=subject_ids_of, since=since, until=until)
    named: list[int] = []
    if candidates:
        named = [int(seq) for seq in (seqs if kept is None else seqs[kept])[-candidates:]]
    if kept is not None:
        scores[~kept] = 0.0
    matching = np.flatnonzero(scores > 0)
    if len(matching) > limit:  # the k-th score, and every memory tied with it (the earlier seq wins a tie)
        kth = np.partition(scores[matching], len(matching) - limit)[len(matching) - limit]
        matching = matching[scores[matching] >= kth]
    best = matching[np.lexsort((matching, -scores[matching]))][:limit]  # seq order = index order
    return RankedPage(head=weights.head, ranked=[Ranked(int(seqs[i]), float(scores[i])) for i in best],
                      candidates=named, generation=weights.generation)
