"""The search index: BM25 postings of each scope's memories, in the database, kept current by appends and erasures.

A search reads only its query terms' postings, and an append or erasure changes them in its own transaction,
so every process sees the change at its commit. Terms are stored only as keyed hashes (HMAC under the scope's
index key). Scoring is bm25s's exactly, over kvengine.retrieval's tokens; the subject and time filters choose
among the scope's memories without changing its statistics. A process keeps the postings it has read, adds
only what was appended past them and drops a scope's when its generation moves (an erasure, a backfill).

keys.py holds the tables, tokenizers and the index key, writes.py indexing and unindexing, ranking.py the search;
every public name is importable from ``memories.search_index``. Design: docs/design/search-index.md.
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
