"""Reads of the memories app (HackSoftware selectors), one module per subdomain; every public name is importable
from ``memories.selectors``.

- log.py: the head, a scope's memories opened (decrypted) as of a head, filtered and one by one;
- subjects.py: a subject id's stored spellings and rows, legacy (global) subjects;
- access.py: scopes for users and staff, users, API tokens;
- erasure.py: what an erasure request erases, its status, requests left unfinished;
- search.py: BM25 (or hybrid) search over a scope's search index.

The modules import each other directly (search and erasure -> log -> subjects), never this package.
"""
from __future__ import annotations

from .access import (
    TOKEN_ID_CHARS,
    scope_get_for_staff,
    scope_get_for_user,
    token_is_limited,
    token_management_check,
    token_scope_ids,
    user_get,
    user_scopes,
    user_token_get,
    user_tokens,
)
from .erasure import (
    erasure_request_get,
    erasure_request_memories,
    erasure_request_status,
    erasure_request_subjects,
    erasure_requests_stuck,
    erasure_requests_unfinished,
    memory_keys_forgotten_lock,
    scope_erasure_requests,
)
from .log import (
    FILTER_OPEN_BATCH,
    MAX_METADATA_FILTER_SCAN,
    MAX_SEQ_DIGITS,
    MemoryIntegrityError,
    OpenedMemory,
    as_of_validate,
    log_head,
    memories_open,
    memory_open,
    memory_own_keys,
    metadata_matches,
    scope_head,
    scope_memories,
    scope_memories_filtered,
    scope_memories_open,
    scope_memory_get,
    shown,
    time_range_validate,
)
from .search import (
    HYBRID_BM25_DEPTH,
    MAX_SEARCH_METADATA_KEYS,
    MAX_SEARCH_QUERY_CHARS,
    MAX_SEARCH_TOP_K,
    SEARCH_RETRIEVERS,
    RankedMemory,
    SearchHit,
    SearchResult,
    memories_search,
    memory_search,
    search_retriever,
)
from .subjects import (
    legacy_subject_erasable_by,
    legacy_subjects_in_scope,
    subject_get,
    subject_id_variants,
)

__all__ = [
    "FILTER_OPEN_BATCH",
    "HYBRID_BM25_DEPTH",
    "MAX_METADATA_FILTER_SCAN",
    "MAX_SEARCH_METADATA_KEYS",
    "MAX_SEARCH_QUERY_CHARS",
    "MAX_SEARCH_TOP_K",
    "MAX_SEQ_DIGITS",
    "MemoryIntegrityError",
    "OpenedMemory",
    "RankedMemory",
    "SEARCH_RETRIEVERS",
    "SearchHit",
    "SearchResult",
    "TOKEN_ID_CHARS",
    "as_of_validate",
    "erasure_request_get",
    "erasure_request_memories",
    "erasure_request_status",
    "erasure_request_subjects",
    "erasure_requests_stuck",
    "erasure_requests_unfinished",
    "legacy_subject_erasable_by",
    "legacy_subjects_in_scope",
    "log_head",
    "memories_open",
    "memories_search",
    "memory_keys_forgotten_lock",
    "memory_open",
    "memory_own_keys",
    "memory_search",
    "metadata_matches",
    "scope_erasure_requests",
    "scope_get_for_staff",
    "scope_get_for_user",
    "scope_head",
    "scope_memories",
    "scope_memories_filtered",
    "scope_memories_open",
    "scope_memory_get",
    "search_retriever",
    "shown",
    "subject_get",
    "subject_id_variants",
    "time_range_validate",
    "token_is_limited",
    "token_management_check",
    "token_scope_ids",
    "user_get",
    "user_scopes",
    "user_token_get",
    "user_tokens",
]
