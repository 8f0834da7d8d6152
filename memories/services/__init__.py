"""Writes to the log: appends, scopes and grants, shredding, erasure requests, master-key rotation.

The log has no update or delete service. The only changes to existing rows are the two a
subject key allows (a one-way shred, a re-wrap by a new master key), and both go through here.
One module per concern; every public name stays importable from ``memories.services``. Sending tasks
is memories.jobs' (services never import tasks).
"""
from __future__ import annotations

from .appends import memory_append
from .erasure import erasure_request_file, erasure_request_process, erasure_requeue_grace_s, subject_shred
from .rotation import RotationReport, master_key_rotate
from .scopes import scope_create, scope_grant, scope_revoke
from .validation import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    MAX_REASON_CHARS,
    MAX_SUBJECT_CHARS,
    content_validate,
    subject_id_validate,
)

__all__ = [
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
    "scope_grant",
    "scope_revoke",
    "subject_id_validate",
    "subject_shred",
]
