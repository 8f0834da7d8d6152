"""The memory log and its keys: append-only rows, protected by triggers on PostgreSQL and by the ORM.

What only PostgreSQL guarantees: the ``pgtrigger`` triggers reject UPDATE, DELETE and TRUNCATE
from *any* client (raw SQL included). On SQLite the same rules hold only through the ORM: ``save()`` of
an existing row, ``delete()`` and queryset ``update()``/``delete()`` raise ``ImmutableRowError``, but
raw SQL can still change rows. Seq allocation without gaps holds on both (see ``services.memory``).
One module per subdomain; every model is imported here, so ``from memories.models import X`` is the way in.
"""
from __future__ import annotations

from memories.models.erasure import ErasureEvent, ErasureKind, ErasureRequest, ErasureStatus
from memories.models.keys import MasterKeyRotation, MemoryKey, ScopeKey, Subject
from memories.models.log import LogHead, Memory
from memories.models.scopes import Scope, ScopeGrant, ScopeGrantAction, ScopeGrantEvent
from memories.models.search import SEARCH_TOKENIZER, SearchDocument, SearchIndex, SearchPosting, SearchTerm
from memories.tokens import ApiTokenProfile  # a model of this app, kept with the token code

__all__ = [
    "SEARCH_TOKENIZER",
    "ApiTokenProfile",
    "ErasureEvent",
    "ErasureKind",
    "ErasureRequest",
    "ErasureStatus",
    "LogHead",
    "MasterKeyRotation",
    "Memory",
    "MemoryKey",
    "Scope",
    "ScopeGrant",
    "ScopeGrantAction",
    "ScopeGrantEvent",
    "ScopeKey",
    "SearchDocument",
    "SearchIndex",
    "SearchPosting",
    "SearchTerm",
    "Subject",
]
