"""Writes to the search index: indexing (appends, the backfill) and unindexing (erasures), in the caller's transaction."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection, models, transaction
from django.utils import timezone

from memories.models import (
    SEARCH_TOKENIZER,
    LogHead,
    Memory,
    Scope,
    SearchDocument,
    SearchIndex,
    SearchPosting,
    SearchTerm,
)

from .keys import (
    DOCS_TABLE,
    INDEX_TABLE,
    POSTINGS_TABLE,
    TERMS_TABLE,
    index_key_for_write,
    index_keys_forget,
    index_tokens,
    sql_in,
    term_digest,
    write_key_forget,
)


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
    guard = f"WHERE EXISTS (SELECT 1 FROM {INDEX_TABLE} k WHERE k.scope_id = %s AND k.wrapped_key = %s AND k.tokenizer = %s)"
    sql = (
        f"WITH posted AS (INSERT INTO {POSTINGS_TABLE} (seq, term, scope_id, tf, length) "
        "SELECT p.seq, p.term, %s, p.tf, p.length FROM unnest(%s::bigint[], %s::bigint[], %s::int[], %s::int[]) "
        f"AS p(seq, term, tf, length) {guard} RETURNING 1), "
        f"termed AS (INSERT INTO {TERMS_TABLE} AS t (scope_id, term, df) "
        f"SELECT %s, n.term, count(*) FROM unnest(%s::bigint[]) AS n(term) {guard} GROUP BY n.term "
        "ON CONFLICT (scope_id, term) DO UPDATE SET df = t.df + EXCLUDED.df RETURNING 1), "
        f"totals AS (UPDATE {INDEX_TABLE} SET num_documents = num_documents + %s, total_length = total_length + %s, "
        "generation = generation + %s WHERE scope_id = %s AND wrapped_key = %s AND tokenizer = %s RETURNING 1) "
        f"INSERT INTO {DOCS_TABLE} (seq, scope_id, subject_id, created_at, length) "
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
            f"INSERT INTO {TERMS_TABLE} (scope_id, term, df) VALUES (%s, %s, %s) "
            "ON CONFLICT (scope_id, term) DO UPDATE SET df = df + excluded.df",
            [(scope_id, term, df) for term, df in Counter(p[1] for p in postings).items()],
        )
        cursor.execute(
            f"UPDATE {INDEX_TABLE} SET num_documents = num_documents + %s, total_length = total_length + %s, "
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
        wrapped, key, tokenizer = index_key_for_write(scope_id, reread=reread)
        docs, postings = _rows(key, tokenizer, texts)
        if portable:
            _insert_portable(scope_id, docs, postings, not appended)
            return
        if _insert_postgresql(scope_id, wrapped, tokenizer, docs, postings, not appended):
            return
        write_key_forget(scope_id)
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
        index_keys_forget(scope=scope)
        return num
    seqs = list(seqs)
    num = 0
    with connection.cursor() as cursor:
        for start in range(0, len(seqs), 10_000):
            where, params = sql_in("seq", seqs[start:start + 10_000])
            cursor.execute(f"SELECT DISTINCT scope_id FROM {DOCS_TABLE} WHERE {where}", params)
            scopes = [row[0] for row in cursor.fetchall()]
            if not scopes:
                continue
            cursor.execute(
                f"UPDATE {TERMS_TABLE} SET df = df - g.c FROM (SELECT scope_id, term, count(*) AS c FROM {POSTINGS_TABLE} "
                f"WHERE {where} GROUP BY scope_id, term) g WHERE {TERMS_TABLE}.scope_id = g.scope_id AND {TERMS_TABLE}.term = g.term",
                params,
            )
            cursor.execute(
                f"UPDATE {INDEX_TABLE} SET num_documents = num_documents - g.n, total_length = total_length - g.l, "
                "generation = generation + 1 "
                f"FROM (SELECT scope_id, count(*) AS n, sum(length) AS l FROM {DOCS_TABLE} WHERE {where} GROUP BY scope_id) g "
                f"WHERE {INDEX_TABLE}.scope_id = g.scope_id",
                params,
            )
            cursor.execute(f"DELETE FROM {POSTINGS_TABLE} WHERE {where}", params)
            cursor.execute(f"DELETE FROM {DOCS_TABLE} WHERE {where}", params)
            num += cursor.rowcount
            # a term no memory holds any more leaves too: its digest would say the scope once held it
            in_scopes, scope_params = sql_in("scope_id", scopes)
            cursor.execute(f"DELETE FROM {TERMS_TABLE} WHERE {in_scopes} AND df <= 0", scope_params)
    return num
