"""The search index: BM25 postings of each scope's memories, in the database, kept current by appends and erasures.

Why in the database: a search reads only postings of its query's terms (no decrypting the scope, no per-request
indexing), and an append or erasure changes the index in its own transaction, so every process sees the change at
its commit. A process keeps the postings it has read, and checks them against the database on every search (below).

- Terms are never stored: a posting holds the first 8 bytes of HMAC-SHA256(the scope's index key, term).
  Without the key the tables cannot be searched for a guessed word; deleting the scope shreds the key.
- Scoring is bm25s's, exactly (kvengine.retrieval: Lucene's BM25, idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
  term part tf / (tf + k1 (1 - b + b dl / avgdl)), k1 = 1.5, b = 0.75, a query term counted once per
  occurrence), over the same tokens (kvengine.retrieval.bm25_tokenize, Porter-stemmed: ``index_tokens``; an
  index records its tokenizer, and one built unstemmed is searched unstemmed until search_index_backfill
  rebuilds it). N, df and avgdl are the scope's (as of
  ``as_of``); the subject and time filters choose among its memories without changing them, as a filter does in
  Lucene. tests/memories/test_search_index.py compares rankings and scores with kvengine.retrieval.Bm25(stem=True).
- Ranking reads the query terms' postings into this process once and then only what was appended past them
  (a scope's head only grows with appends); an erasure or a backfill moves the scope's generation in its own
  transaction, and the next search in any process drops what it held of that scope. Ranked in SQL instead, a
  question holding "the" made PostgreSQL aggregate the postings of nearly every memory of the scope per request
  (BENCHMARKS.md: 130-240 ms at 100,000 memories); numpy does it in a few milliseconds.
- An erased memory has no postings: an erasure deletes them (and lowers the counts) in the transaction that
  records its keys shredded (memories.services.erasure); a memory that opens as erased is dropped all the same.

keys.py holds the tables, tokenizers and the index key, writes.py indexing and unindexing, ranking.py the search;
every public name is importable from ``memories.search_index``.
"""
from __future__ import annotations

from .keys import (
    DOCS_TABLE,
    INDEX_TABLE,
    MEMORIES_TABLE,
    POSTINGS_TABLE,
    TERMS_TABLE,
    TOKENIZERS,
    index_key_aad,
    index_key_for_read,
    index_key_for_write,
    index_keys_forget,
    index_tokens,
    sql_in,
    term_digest,
    write_key_forget,
)
from .ranking import (
    Ranked,
    RankedPage,
    rank,
    weights_statement,
)
from .writes import (
    IndexedText,
    documents_index,
    index_reset,
    memories_index,
    memories_unindex,
)

__all__ = [
    "DOCS_TABLE",
    "INDEX_TABLE",
    "IndexedText",
    "MEMORIES_TABLE",
    "POSTINGS_TABLE",
    "Ranked",
    "RankedPage",
    "TERMS_TABLE",
    "TOKENIZERS",
    "documents_index",
    "index_key_aad",
    "index_key_for_read",
    "index_key_for_write",
    "index_keys_forget",
    "index_reset",
    "index_tokens",
    "memories_index",
    "memories_unindex",
    "rank",
    "sql_in",
    "term_digest",
    "weights_statement",
    "write_key_forget",
]
