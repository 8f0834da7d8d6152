"""The search index: BM25 postings of each scope's memories, in the database, kept current by appends and erasures.

Why in the database and not in a process: a search then reads only the postings of its query's terms (no
decrypting the scope, no per-request indexing), and an append or erasure changes the index in its own
transaction, so every process sees the change at its commit: there is no in-process copy to purge.

- Terms are never stored: a posting holds the first 8 bytes of HMAC-SHA256(the scope's SearchIndexKey, term).
  Without the key the table cannot be searched for a guessed word; deleting the scope shreds the key.
- Scoring is bm25s's, exactly (kvengine.retrieval: Lucene's BM25, idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
  term part tf / (tf + k1 (1 - b + b dl / avgdl)), k1 = 1.5, b = 0.75, a query term counted once per
  occurrence), over the same tokens (kvengine.retrieval.bm25_tokenize), computed in SQL over the postings.
  N, df and avgdl are over the memories the search's filters keep, as an index built of those memories
  would have them; tests/memories/test_search_index.py compares rankings with kvengine.retrieval.Bm25.
- An erased memory has no postings: an erasure deletes them in the transaction that records its keys shredded
  (memories.services.erasure); a memory that opens as erased is dropped by the reader all the same.
"""
from __future__ import annotations

import hmac
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from kvengine.retrieval import BM25_B, BM25_K1, bm25_tokenize
from memories import crypto
from memories.models import Memory, Scope, SearchDocument, SearchIndexKey, SearchPosting, Subject

_DOCS = SearchDocument._meta.db_table
_POSTINGS = SearchPosting._meta.db_table
_KEYS = SearchIndexKey._meta.db_table
_MEMORIES = Memory._meta.db_table
_SUBJECTS = Subject._meta.db_table


def index_key_aad(scope_id: int) -> bytes:
    """Associated data of a wrapped search index key: its scope."""
    return f"mnesio:search-index-key:v1|scope={scope_id}".encode()


# scope id -> (wrapped bytes, key) as this process last read them. An append checks in its INSERT that the row
# still holds these bytes (a re-wrap by a new master key changes them, and a test database can reuse an id), so a
# stale entry is never used to write; it only saves a read.
_keys: dict[int, tuple[bytes, bytes]] = {}


@sensitive_variables()
def _key_unwrap(row: SearchIndexKey) -> bytes:
    wrapped = bytes(row.wrapped_key)
    cached = _keys.get(row.scope_id)
    if cached is not None and cached[0] == wrapped:
        return cached[1]
    key = crypto.unwrap(wrapped, wrapped_by=row.master_key_id, aad=index_key_aad(row.scope_id))
    _keys[row.scope_id] = (wrapped, key)
    return key


@sensitive_variables()
def _key_for_write(scope_id: int, *, reread: bool) -> tuple[bytes, bytes]:
    """The scope's (wrapped, key), created on first use. Callers hold the log counter's lock (appends, backfill),
    so two writers never create it at once."""
    if not reread and scope_id in _keys:
        return _keys[scope_id]
    row = SearchIndexKey.objects.filter(scope_id=scope_id).first()
    if row is None:
        key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(key, aad=index_key_aad(scope_id))
        SearchIndexKey.objects.create(scope_id=scope_id, wrapped_key=wrapped, master_key_id=kid)
        _keys[scope_id] = (bytes(wrapped), key)
        return _keys[scope_id]
    if row.wrapped_key is None:
        raise AssertionError(f"scope {scope_id}'s search index key is shredded: the scope is deleted")
    return bytes(row.wrapped_key), _key_unwrap(row)


# (scope id, scope created_at) -> its key, for searches: a search reads no key row once its process knows the key.
# A key never changes while its scope lives (a master-key rotation re-wraps the same key), and a deleted scope
# has no postings left to search; created_at tells a scope from another that reuses its id (a test database).
_read_keys: dict[tuple[int, object], bytes] = {}


def index_key_for_read(*, scope: Scope) -> bytes | None:
    """The scope's index key (a query the first time), or None when nothing of the scope was ever indexed or its
    key is shredded."""
    cached = _read_keys.get((scope.pk, scope.created_at))
    if cached is not None:
        return cached
    row = SearchIndexKey.objects.filter(scope_id=scope.pk).first()
    if row is None or row.wrapped_key is None:
        return None
    key = _read_keys[(scope.pk, scope.created_at)] = _key_unwrap(row)
    return key


def term_digest(key: bytes, term: str) -> int:
    """A term's digest under a scope's key: the first 8 bytes of HMAC-SHA256, as a signed bigint."""
    return int.from_bytes(hmac.digest(key, term.encode(), "sha256")[:8], "big", signed=True)


@dataclass(frozen=True)
class IndexedText:
    """What indexing one memory needs: its row's identity and filters, and its opened text."""

    seq: int
    subject_id: int | None
    created_at: object  # a datetime
    text: str


def _rows(key: bytes, scope_id: int, texts: Sequence[IndexedText]) -> tuple[list[tuple], list[tuple]]:
    """Document rows (seq, subject, created_at, length) and posting rows (seq, term, tf, length)."""
    digests: dict[str, int] = {}
    docs, postings = [], []
    for item in texts:
        tokens = bm25_tokenize(item.text)
        counts: Counter[int] = Counter()
        for token in tokens:
            digest = digests.get(token)
            if digest is None:
                digest = digests[token] = term_digest(key, token)
            counts[digest] += 1
        docs.append((item.seq, item.subject_id, item.created_at, len(tokens)))
        postings.extend((item.seq, digest, tf, len(tokens)) for digest, tf in counts.items())
    return docs, postings


def _insert_postgresql(scope_id: int, wrapped: bytes, docs: list[tuple], postings: list[tuple]) -> bool:
    """One statement (one round trip), written only if the scope's key row still holds ``wrapped``; False if not."""
    guard = f"WHERE EXISTS (SELECT 1 FROM {_KEYS} k WHERE k.scope_id = %s AND k.wrapped_key = %s)"
    sql = (
        f"WITH posted AS (INSERT INTO {_POSTINGS} (seq, term, scope_id, tf, length) "
        "SELECT p.seq, p.term, %s, p.tf, p.length FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[]) "
        f"AS p(seq, term, tf, length) {guard} RETURNING 1) "
        f"INSERT INTO {_DOCS} (seq, scope_id, subject_id, created_at, length) "
        "SELECT d.seq, %s, d.subject_id, d.created_at, d.length "
        "FROM unnest(%s::bigint[], %s::bigint[], %s::timestamptz[], %s::int[]) "
        f"AS d(seq, subject_id, created_at, length) {guard} RETURNING 1"
    )
    columns = list(zip(*postings, strict=True)) if postings else [[], [], [], []]
    doc_columns = list(zip(*docs, strict=True))
    params = [scope_id, *map(list, columns), scope_id, wrapped, scope_id, *map(list, doc_columns), scope_id, wrapped]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return len(cursor.fetchall()) == len(docs)


def documents_index(*, scope_id: int, texts: Sequence[IndexedText]) -> None:
    """Index memories of one scope (opened texts), in the caller's transaction; the caller holds the counter lock.

    On PostgreSQL one statement; it checks the key this process cached, and reads the key again if that changed.
    """
    if not texts:
        return
    assert transaction.get_connection().in_atomic_block
    for reread in (False, True):
        wrapped, key = _key_for_write(scope_id, reread=reread)
        docs, postings = _rows(key, scope_id, texts)
        if connection.vendor != "postgresql":
            SearchDocument.objects.bulk_create([
                SearchDocument(memory_id=seq, scope_id=scope_id, subject_id=subject_id, created_at=created_at, length=n)
                for seq, subject_id, created_at, n in docs
            ])
            SearchPosting.objects.bulk_create([
                SearchPosting(seq=seq, term=term, scope_id=scope_id, tf=tf, length=n) for seq, term, tf, n in postings
            ])
            return
        if _insert_postgresql(scope_id, wrapped, docs, postings):
            return
        _keys.pop(scope_id, None)
    raise AssertionError(f"scope {scope_id}'s search index key changed twice during one append")


def memories_index(*, memories: Sequence[Memory], texts: Sequence[str]) -> None:
    """Index new rows of one scope with their texts (an append, in its transaction)."""
    if memories:
        documents_index(scope_id=memories[0].scope_id, texts=[
            IndexedText(m.seq, m.subject_id, m.created_at, text) for m, text in zip(memories, texts, strict=True)
        ])


def memories_unindex(*, seqs: Iterable[int] | None = None, scope: Scope | None = None) -> int:
    """Delete the postings and documents of ``seqs`` (a queryset of seqs or a list), or all of ``scope``'s and
    shred its index key; return how many documents went. Runs in the erasure's transaction."""
    assert (seqs is None) != (scope is None)
    if scope is not None:
        SearchPosting.objects.filter(scope_id=scope.pk).delete()
        num = SearchDocument.objects.filter(scope_id=scope.pk).delete()[0]
        SearchIndexKey.objects.filter(scope_id=scope.pk, shredded_at__isnull=True).update(
            wrapped_key=None, shredded_at=timezone.now()
        )
        _keys.pop(scope.pk, None)
        _read_keys.pop((scope.pk, scope.created_at), None)
        return num
    SearchPosting.objects.filter(seq__in=seqs).delete()
    return SearchDocument.objects.filter(memory_id__in=seqs).delete()[0]


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


def rank(
    *,
    scope: Scope,
    key: bytes | None,
    query: str,
    limit: int,
    subject_ids_of: Sequence[str] | None = None,
    since=None,
    until=None,
    as_of: int | None = None,
) -> RankedPage:
    """The ``limit`` best memories of ``scope`` for ``query`` by BM25, in one statement (with the scope's head).

    Filters: ``subject_ids_of`` (the subject external id spellings to keep), ``since <= created_at < until``,
    ``seq <= as_of``; the statistics (N, df, avgdl) are those of the memories the filters keep.
    """
    head_sql = f"SELECT max(seq) AS head FROM {_MEMORIES} WHERE scope_id = %s"
    params: list = [scope.pk]
    counts = Counter(term_digest(key, token) for token in bm25_tokenize(query)) if key is not None else Counter()
    if not counts:
        with connection.cursor() as cursor:
            cursor.execute(head_sql, params)
            return RankedPage(head=cursor.fetchone()[0] or 0, ranked=[])
    doc_where, doc_params = ["d.scope_id = %s"], [scope.pk]
    if subject_ids_of is not None:
        marks = ", ".join(["%s"] * len(subject_ids_of))
        doc_where.append(f"d.subject_id IN (SELECT s.id FROM {_SUBJECTS} s WHERE s.external_id IN ({marks}))")
        doc_params += list(subject_ids_of)
    if since is not None:
        doc_where.append("d.created_at >= %s")
        doc_params.append(since)
    if until is not None:
        doc_where.append("d.created_at < %s")
        doc_params.append(until)
    post_where, post_params = ["p.scope_id = %s"], [scope.pk]
    if as_of is not None:
        doc_where.append("d.seq <= %s")
        doc_params.append(as_of)
        post_where.append("p.seq <= %s")
        post_params.append(as_of)
    if len(doc_where) > 1 + (as_of is not None):  # a filter the postings do not carry: keep the documents it keeps
        post_where.append(f"p.seq IN (SELECT d.seq FROM {_DOCS} d WHERE {' AND '.join(doc_where)})")
        post_params += doc_params
    values = ", ".join(["(CAST(%s AS bigint), CAST(%s AS double precision))"] * len(counts))
    value_params = [v for term, qtf in counts.items() for v in (term, float(qtf))]
    sql = (
        f"WITH q(term, qtf) AS (VALUES {values}), "
        f"stats AS (SELECT CAST(count(*) AS double precision) AS n, CAST(avg(d.length) AS double precision) AS avgdl "
        f"FROM {_DOCS} d WHERE {' AND '.join(doc_where)}), "
        f"hits AS (SELECT p.seq, p.term, p.tf, p.length FROM {_POSTINGS} p "
        f"WHERE p.term IN (SELECT term FROM q) AND {' AND '.join(post_where)}), "
        "df AS (SELECT term, count(*) AS df FROM hits GROUP BY term), "
        "weights AS (SELECT q.term, q.qtf * ln(1 + (stats.n - df.df + 0.5) / (df.df + 0.5)) AS w "
        "FROM q JOIN df ON df.term = q.term CROSS JOIN stats), "
        "scored AS (SELECT h.seq, sum(weights.w * h.tf / (h.tf + %s * (1 - %s + %s * h.length / stats.avgdl))) AS score "
        "FROM hits h JOIN weights ON weights.term = h.term CROSS JOIN stats GROUP BY h.seq "
        "ORDER BY score DESC, h.seq LIMIT %s), "
        f"head AS ({head_sql}) "
        "SELECT head.head, scored.seq, scored.score FROM head LEFT JOIN scored ON 1 = 1 ORDER BY scored.score DESC, scored.seq"
    )
    params = [*value_params, *doc_params, *post_params, BM25_K1, BM25_B, BM25_B, limit, scope.pk]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    ranked = [Ranked(int(seq), float(score)) for _, seq, score in rows if seq is not None]
    return RankedPage(head=rows[0][0] or 0, ranked=ranked)
