"""The search index: BM25 postings of each scope's memories, in the database, kept current by appends and erasures.

A search reads only its query terms' postings, and an append or erasure changes them in its own transaction,
so every process sees the change at its commit. Terms are stored only as keyed hashes (HMAC under the scope's
index key). Scoring is bm25s's exactly, over kvengine.retrieval's tokens; the subject and time filters choose
among the scope's memories without changing its statistics. A process keeps the postings it has read, adds
only what was appended past them and drops a scope's when its generation moves (an erasure, a backfill).

Design: docs/design/search-index.md.
"""
from __future__ import annotations

import hmac
import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db import connection, models, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from kvengine.retrieval import BM25_B, BM25_K1, bm25_tokenize
from memories import crypto
from memories.models import (
    SEARCH_TOKENIZER,
    LogHead,
    Memory,
    Scope,
    SearchDocument,
    SearchIndex,
    SearchPosting,
    SearchTerm,
    Subject,
)

_DOCS = SearchDocument._meta.db_table
_POSTINGS = SearchPosting._meta.db_table
_TERMS = SearchTerm._meta.db_table
_INDEX = SearchIndex._meta.db_table
_MEMORIES = Memory._meta.db_table
_NO_HEAD = 2**63 - 1  # as_of when none is given: every seq is at or before it


# SearchIndex.tokenizer -> whether its terms are stemmed. An index is searched and appended to with its own
# tokenizer, so an index built before stemming answers as it did until search_index_backfill rebuilds it.
TOKENIZERS = {1: False, 2: True}
assert SEARCH_TOKENIZER in TOKENIZERS


def index_tokens(text: str, *, tokenizer: int = SEARCH_TOKENIZER) -> list[str]:
    """The terms of ``text`` as an index of ``tokenizer`` holds them (Porter-stemmed words by default)."""
    return bm25_tokenize(text, stem=TOKENIZERS[tokenizer])


def index_key_aad(scope_id: int) -> bytes:
    """Associated data of a wrapped search index key: its scope."""
    return f"mnesio:search-index-key:v1|scope={scope_id}".encode()


# scope id -> (wrapped bytes, key, tokenizer) as this process last read them. An append checks in its INSERT that
# the row still holds these bytes and tokenizer (a re-wrap by a new master key changes the bytes, a rebuild the
# tokenizer, and a test database can reuse an id), so a stale entry is never used to write; it only saves a read.
_keys: dict[int, tuple[bytes, bytes, int]] = {}
# (scope id, scope created_at) -> the tokenizer a search of the scope assumes; the search reads the index's own and
# tokenizes the query again when it differs (once after a rebuild)
_read_tokenizers: dict[tuple[int, object], int] = {}
# (scope id, scope created_at) -> its key, for searches: a search reads no key row once its process knows the key.
# A key never changes while its scope lives (a master-key rotation re-wraps the same key), and a deleted scope
# has no postings left to search; created_at tells a scope from another that reuses its id (a test database).
_read_keys: dict[tuple[int, object], bytes] = {}


@sensitive_variables()
def _key_unwrap(row: SearchIndex) -> bytes:
    wrapped = bytes(row.wrapped_key)
    cached = _keys.get(row.scope_id)
    if cached is not None and cached[0] == wrapped:
        key = cached[1]
    else:
        key = crypto.unwrap(wrapped, wrapped_by=row.wrapped_by, aad=index_key_aad(row.scope_id))
    _keys[row.scope_id] = (wrapped, key, row.tokenizer)
    return key


@sensitive_variables()
def _key_for_write(scope_id: int, *, reread: bool) -> tuple[bytes, bytes, int]:
    """The scope's (wrapped, key, tokenizer), created on first use. Callers hold the log counter's lock (appends,
    backfill), so two writers never create it at once."""
    if not reread and scope_id in _keys:
        return _keys[scope_id]
    row = SearchIndex.objects.filter(scope_id=scope_id).first()
    if row is None:
        key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(key, aad=index_key_aad(scope_id))
        SearchIndex.objects.create(scope_id=scope_id, wrapped_key=wrapped, wrapped_by=kid, tokenizer=SEARCH_TOKENIZER)
        _keys[scope_id] = (bytes(wrapped), key, SEARCH_TOKENIZER)
        return _keys[scope_id]
    if row.wrapped_key is None:
        raise AssertionError(f"scope {scope_id}'s search index key is shredded: the scope is deleted")
    _key_unwrap(row)
    return _keys[scope_id]


def index_key_for_read(*, scope: Scope) -> bytes | None:
    """The scope's index key (a query the first time), or None when nothing of the scope was ever indexed or its
    key is shredded."""
    cached = _read_keys.get((scope.pk, scope.created_at))
    if cached is not None:
        return cached
    row = SearchIndex.objects.filter(scope_id=scope.pk).first()
    if row is None or row.wrapped_key is None:
        return None
    key = _read_keys[(scope.pk, scope.created_at)] = _key_unwrap(row)
    return key


def term_digest(key: bytes, term: str) -> int:
    """A term's digest under a scope's key: the first 8 bytes of HMAC-SHA256, as a signed bigint."""
    return int.from_bytes(hmac.digest(key, term.encode(), "sha256")[:8], "big", signed=True)


# ---------------------------------------------------------------------------
# Writes: indexing (appends, the backfill) and unindexing (erasures)
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexedText:
    """What indexing one memory needs: its row's identity and filters, and its opened text."""

    seq: int
    subject_id: int | None
    created_at: object  # a datetime
    text: str


def _rows(key: bytes, tokenizer: int, texts: Sequence[IndexedText]) -> tuple[list[tuple], list[tuple]]:
    """Document rows (seq, subject, created_at, length) and posting rows (seq, term, tf, length)."""
    digests: dict[str, int] = {}
    docs, postings = [], []
    for item in texts:
        tokens = index_tokens(item.text, tokenizer=tokenizer)
        counts: Counter[int] = Counter()
        for token in tokens:
            digest = digests.get(token)
            if digest is None:
                digest = digests[token] = term_digest(key, token)
            counts[digest] += 1
        docs.append((item.seq, item.subject_id, item.created_at, len(tokens)))
        postings.extend((item.seq, digest, tf, len(tokens)) for digest, tf in counts.items())
    return docs, postings


def _insert_postgresql(scope_id: int, wrapped: bytes, tokenizer: int, docs: list[tuple], postings: list[tuple],
                       bump: bool) -> bool:
    """One statement (one round trip), written only if the scope's key row still holds ``wrapped`` and
    ``tokenizer``; False if not."""
    guard = f"WHERE EXISTS (SELECT 1 FROM {_INDEX} k WHERE k.scope_id = %s AND k.wrapped_key = %s AND k.tokenizer = %s)"
    sql = (
        f"WITH posted AS (INSERT INTO {_POSTINGS} (seq, term, scope_id, tf, length) "
        "SELECT p.seq, p.term, %s, p.tf, p.length FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[]) "
        f"AS p(seq, term, tf, length) {guard} RETURNING 1), "
        f"termed AS (INSERT INTO {_TERMS} AS t (scope_id, term, df) "
        f"SELECT %s, n.term, count(*) FROM unnest(%s::bigint[]) AS n(term) {guard} GROUP BY n.term "
        "ON CONFLICT (scope_id, term) DO UPDATE SET df = t.df + EXCLUDED.df RETURNING 1), "
        f"totals AS (UPDATE {_INDEX} SET num_documents = num_documents + %s, total_length = total_length + %s, "
        "generation = generation + %s WHERE scope_id = %s AND wrapped_key = %s AND tokenizer = %s RETURNING 1) "
        f"INSERT INTO {_DOCS} (seq, scope_id, subject_id, created_at, length) "
        "SELECT d.seq, %s, d.subject_id, d.created_at, d.length "
        "FROM unnest(%s::bigint[], %s::bigint[], %s::timestamptz[], %s::int[]) "
        f"AS d(seq, subject_id, created_at, length) {guard} RETURNING 1"
    )
    columns = [list(c) for c in zip(*postings, strict=True)] if postings else [[], [], [], []]
    doc_columns = [list(c) for c in zip(*docs, strict=True)]
    params = [
        scope_id, *columns, scope_id, wrapped, tokenizer,
        scope_id, columns[1], scope_id, wrapped, tokenizer,
        len(docs), sum(doc_columns[3]), int(bump), scope_id, wrapped, tokenizer,
        scope_id, *doc_columns, scope_id, wrapped, tokenizer,
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return len(cursor.fetchall()) == len(docs)


def _insert_portable(scope_id: int, docs: list[tuple], postings: list[tuple], bump: bool) -> None:
    """The same rows through the ORM and an upsert (SQLite, the embedded default)."""
    SearchDocument.objects.bulk_create([
        SearchDocument(memory_id=seq, scope_id=scope_id, subject_id=subject_id, created_at=created_at, length=n)
        for seq, subject_id, created_at, n in docs
    ])
    SearchPosting.objects.bulk_create([
        SearchPosting(seq=seq, term=term, scope_id=scope_id, tf=tf, length=n) for seq, term, tf, n in postings
    ])
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {_TERMS} (scope_id, term, df) VALUES (%s, %s, %s) "
            "ON CONFLICT (scope_id, term) DO UPDATE SET df = df + excluded.df",
            [(scope_id, term, df) for term, df in Counter(p[1] for p in postings).items()],
        )
        cursor.execute(
            f"UPDATE {_INDEX} SET num_documents = num_documents + %s, total_length = total_length + %s, "
            "generation = generation + %s WHERE scope_id = %s",
            [len(docs), sum(d[3] for d in docs), int(bump), scope_id],
        )


def documents_index(*, scope_id: int, texts: Sequence[IndexedText], appended: bool = False) -> None:
    """Index memories of one scope (opened texts), in the caller's transaction; the caller holds the counter lock.

    ``appended``: they are the newest of the scope (an append), which processes read as a delta; anything else
    (the backfill) moves the scope's generation. Tokenized with the index's tokenizer. On PostgreSQL one statement;
    it checks the key and tokenizer this process cached, and reads them again if they changed (elsewhere, SQLite
    reads them every time).
    """
    if not texts:
        return
    assert transaction.get_connection().in_atomic_block
    portable = connection.vendor != "postgresql"
    for reread in (portable, True):
        wrapped, key, tokenizer = _key_for_write(scope_id, reread=reread)
        docs, postings = _rows(key, tokenizer, texts)
        if portable:
            _insert_portable(scope_id, docs, postings, not appended)
            return
        if _insert_postgresql(scope_id, wrapped, tokenizer, docs, postings, not appended):
            return
        _keys.pop(scope_id, None)
    raise AssertionError(f"scope {scope_id}'s search index key changed twice during one append")


def memories_index(*, memories: Sequence[Memory], texts: Sequence[str]) -> None:
    """Index new rows of one scope with their texts (an append, in its transaction)."""
    if memories:
        documents_index(scope_id=memories[0].scope_id, appended=True, texts=[
            IndexedText(m.seq, m.subject_id, m.created_at, text) for m, text in zip(memories, texts, strict=True)
        ])


def index_reset(*, scope_id: int) -> None:
    """Empty the scope's index and give it the current tokenizer: a rebuild's first step, in its transaction (the
    caller holds the counter lock and indexes every memory again before it commits)."""
    SearchPosting.objects.filter(scope_id=scope_id).delete()
    SearchTerm.objects.filter(scope_id=scope_id).delete()
    SearchDocument.objects.filter(scope_id=scope_id).delete()
    SearchIndex.objects.filter(scope_id=scope_id).update(
        num_documents=0, total_length=0, tokenizer=SEARCH_TOKENIZER, generation=models.F("generation") + 1
    )


def _in(column: str, values: list) -> tuple[str, list]:
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [values]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def memories_unindex(*, seqs: Sequence[int] | None = None, scope: Scope | None = None) -> int:
    """Delete the postings and documents of ``seqs``, lowering the counts, or all of ``scope``'s (and shred its
    index key); return how many documents went. In the caller's transaction (an erasure's)."""
    assert (seqs is None) != (scope is None)
    # the counter lock: appends (which raise the same counts) and the backfill wait. Appends take it before any
    # subject row, so the caller takes it before it locks subjects (memories.services.erasure_request_shred)
    list(LogHead.objects.select_for_update().filter(pk=1).values_list("pk", flat=True))
    if scope is not None:
        SearchPosting.objects.filter(scope_id=scope.pk).delete()
        SearchTerm.objects.filter(scope_id=scope.pk).delete()
        num = SearchDocument.objects.filter(scope_id=scope.pk).delete()[0]
        SearchIndex.objects.filter(scope_id=scope.pk, shredded_at__isnull=True).update(
            wrapped_key=None, shredded_at=timezone.now(), num_documents=0, total_length=0,
            generation=models.F("generation") + 1,
        )
        _keys.pop(scope.pk, None)
        _read_keys.pop((scope.pk, scope.created_at), None)
        return num
    seqs = list(seqs)
    num = 0
    with connection.cursor() as cursor:
        for start in range(0, len(seqs), 10_000):
            where, params = _in("seq", seqs[start:start + 10_000])
            cursor.execute(f"SELECT DISTINCT scope_id FROM {_DOCS} WHERE {where}", params)
            scopes = [row[0] for row in cursor.fetchall()]
            if not scopes:
                continue
            cursor.execute(
                f"UPDATE {_TERMS} SET df = df - g.c FROM (SELECT scope_id, term, count(*) AS c FROM {_POSTINGS} "
                f"WHERE {where} GROUP BY scope_id, term) g WHERE {_TERMS}.scope_id = g.scope_id AND {_TERMS}.term = g.term",
                params,
            )
            cursor.execute(
                f"UPDATE {_INDEX} SET num_documents = num_documents - g.n, total_length = total_length - g.l, "
                "generation = generation + 1 "
                f"FROM (SELECT scope_id, count(*) AS n, sum(length) AS l FROM {_DOCS} WHERE {where} GROUP BY scope_id) g "
                f"WHERE {_INDEX}.scope_id = g.scope_id",
                params,
            )
            cursor.execute(f"DELETE FROM {_POSTINGS} WHERE {where}", params)
            cursor.execute(f"DELETE FROM {_DOCS} WHERE {where}", params)
            num += cursor.rowcount
            # a term no memory holds any more leaves too: its digest would say the scope once held it
            in_scopes, scope_params = _in("scope_id", scopes)
            cursor.execute(f"DELETE FROM {_TERMS} WHERE {in_scopes} AND df <= 0", scope_params)
    return num


# ---------------------------------------------------------------------------
# Reads: ranking
# ---------------------------------------------------------------------------
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
    terms, term_params = _in("t.term", list(counts))
    sql = (
        f"SELECT 0, i.generation, i.num_documents - (SELECT count(*) FROM {_DOCS} d WHERE d.scope_id = %s "
        f"AND d.seq > %s), CAST(NULL AS timestamp with time zone), i.total_length - (SELECT coalesce(sum(d.length), 0) FROM {_DOCS} d "
        f"WHERE d.scope_id = %s AND d.seq > %s), i.tokenizer FROM {_INDEX} i WHERE i.scope_id = %s "
        f"UNION ALL SELECT 1, t.term, t.df - (SELECT count(*) FROM {_POSTINGS} p WHERE p.scope_id = t.scope_id "
        f"AND p.term = t.term AND p.seq > %s), CAST(NULL AS timestamp with time zone), 0, 0 FROM {_TERMS} t WHERE t.scope_id = %s AND {terms} "
        f"UNION ALL SELECT 2, 0, max(m.seq), CAST(NULL AS timestamp with time zone), 0, 0 FROM {_MEMORIES} m WHERE m.scope_id = %s"
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
    upto = f"(SELECT max(m.seq) FROM {_MEMORIES} m WHERE m.scope_id = %s)" if head is None else "%s"
    upto_param = scope.pk if head is None else head
    sql = (f"SELECT 3, 0, d.seq, d.created_at, d.length, coalesce(d.subject_id, -1) FROM {_DOCS} d "
           f"WHERE d.scope_id = %s AND d.seq > %s AND d.seq <= {upto}")
    params: list = [scope.pk, held.upto, upto_param]
    for term in terms:  # one index range per term (an OR of them became a bitmap scan of the table)
        sql += (" UNION ALL SELECT 4, p.term, p.seq, CAST(NULL AS timestamp with time zone), p.tf, 0 "
                f"FROM {_POSTINGS} p WHERE p.scope_id = %s AND p.term = %s AND p.seq > %s AND p.seq <= {upto}")
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
