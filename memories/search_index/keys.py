"""The index's tables and tokenizers, and its key: wrapped per scope, unwrapped once per process, and the term digest
that a posting stores instead of the term."""
from __future__ import annotations

import hmac

from django.db import connection
from django.views.decorators.debug import sensitive_variables

from kvengine.retrieval import bm25_tokenize
from memories import crypto
from memories.models import (
    SEARCH_TOKENIZER,
    Memory,
    Scope,
    SearchDocument,
    SearchIndex,
    SearchPosting,
    SearchTerm,
)

DOCS_TABLE = SearchDocument._meta.db_table
POSTINGS_TABLE = SearchPosting._meta.db_table
TERMS_TABLE = SearchTerm._meta.db_table
INDEX_TABLE = SearchIndex._meta.db_table
MEMORIES_TABLE = Memory._meta.db_table


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
def index_key_for_write(scope_id: int, *, reread: bool) -> tuple[bytes, bytes, int]:
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


def sql_in(column: str, values: list) -> tuple[str, list]:
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [values]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


def write_key_forget(scope_id: int) -> None:
    """Drop this process's write entry of the scope's key (the row changed under it: read it again)."""
    _keys.pop(scope_id, None)


def index_keys_forget(*, scope: Scope) -> None:
    """Drop what this process holds of ``scope``'s index key (its key is shredded: unindexing a whole scope)."""
    write_key_forget(scope.pk)
    _read_keys.pop((scope.pk, scope.created_at), None)
