"""Writes to the log: appends (single and batch), scopes and grants, shredding, erasure requests (a subject,
one memory, a whole scope), own-key backfill, master-key rotation.

The log has no update or delete service. The only changes to existing rows are the ones a key row
allows (a one-way shred, a re-wrap by a new master key, a re-key by the backfill), and all go through here.
One module per concern; every public name stays importable from ``memories.services``. Sending tasks
is memories.jobs' (services never import tasks).
"""
from __future__ import annotations

from .appends import AppendOutcome, memories_append_batch, memory_append
from .backfill import memory_keys_backfill, memory_keys_backfill_parent
from .erasure import erasure_request_file, erasure_request_process, erasure_request_shred, erasure_requeue_grace_s
from .forget import memory_forget_file, scope_delete_file
from .rotation import RotationReport, master_key_rotate
from .scopes import scope_create, scope_grant, scope_revoke
from .search_index import search_index_backfill, search_index_erase
from .shred import memory_key_shred, scope_keys_shred, subject_shred
from .tokens import api_token_create, api_token_revoke, user_invite
from .validation import (
    MAX_BATCH_ITEMS,
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_REASON_CHARS,
    MAX_SUBJECT_CHARS,
    content_validate,
    metadata_validate,
    subject_id_validate,
)

__all__ = [
    "AppendOutcome",
    "api_token_create",
    "api_token_revoke",
    "user_invite",
    "MAX_BATCH_ITEMS",
    "memories_append_batch",
    "memory_forget_file",
    "memory_key_shred",
    "memory_keys_backfill",
    "memory_keys_backfill_parent",
    "metadata_validate",
    "scope_delete_file",
    "scope_keys_shred",
    "erasure_request_shred",
    "MAX_IDEMPOTENCY_KEY_CHARS",
    "MAX_REASON_CHARS",
    "MAX_SUBJECT_CHARS",
    "RotationReport",
    "content_validate",
    "erasure_request_file",
    "erasure_request_process",
    "erasure_requeue_grace_s",
    "master_key_rotate",
    "memory_append",
    "scope_create",
    "search_index_backfill",
    "search_index_erase",
    "scope_grant",
    "scope_revoke",
    "subject_id_validate",
    "subject_shred",
]
