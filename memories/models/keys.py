"""The wrapped data keys: a scope's, a subject's and a memory's own, each shredded one way, and the master-key
rotations that retire the keys wrapping them."""
from __future__ import annotations

import pgtrigger
from django.db import models
from django.utils import timezone

from core.models import AppendOnlyModel, append_only_triggers, reject_truncate
from memories.models.scopes import Scope

# A wrapped key may change in exactly three ways: a re-wrap by a new master key (same key_generation), a
# re-key (memories.services.memory_keys_backfill: a new data key, key_generation + 1), or a one-way shred.
_REWRAP_SQL = (
    "OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL"
    " AND ((NEW.wrapped_by IS DISTINCT FROM OLD.wrapped_by AND NEW.key_generation = OLD.key_generation)"
    " OR NEW.key_generation = OLD.key_generation + 1)"
)
_SHRED_SQL = (
    "OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL"
    " AND NEW.key_generation = OLD.key_generation"
)


def key_xor_shredded(name: str) -> models.CheckConstraint:
    """A shredded row has no key bytes, and a live one has them: the database checks both."""
    return models.CheckConstraint(
        condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
        | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True),
        name=name,
    )


def rewrap_rekey_or_shred_trigger(kept_sql: str) -> pgtrigger.Protect:
    """protect_update of a wrapped key: only a re-wrap, a re-key or the shred, with ``kept_sql`` (SQL over NEW and
    OLD) holding."""
    return pgtrigger.Protect(
        name="protect_update",
        operation=pgtrigger.Update,
        condition=pgtrigger.Condition(f"NOT ((({_SHRED_SQL}) OR ({_REWRAP_SQL})) AND {kept_sql})"),
    )


class ScopeKey(AppendOnlyModel):
    """The data key of a scope, wrapped by the master key: it wraps the own keys of the scope's memories
    without a subject (and sealed such memories directly before memories had keys of their own).

    Shredded (one way) when the scope is deleted. ``key_generation`` grows by one when a backfill re-keys it
    (memories.services.memory_keys_backfill): the old data key, the one legacy rows were sealed with, is
    then gone from the database.
    """

    scope = models.OneToOneField(Scope, on_delete=models.PROTECT, related_name="key")
    wrapped_key = models.BinaryField(null=True)
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    created_at = models.DateTimeField(default=timezone.now)
    key_generation = models.PositiveIntegerField(default=1)
    shredded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            key_xor_shredded("memories_scopekey_key_xor_shredded"),
        ]
        triggers = [
            rewrap_rekey_or_shred_trigger("NEW.id = OLD.id AND NEW.scope_id = OLD.scope_id AND NEW.created_at = OLD.created_at"),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None


class MasterKeyRotation(AppendOnlyModel):
    """A master-key rotation, recorded before its re-wrap starts: the master keys it retired wrap nothing more.

    ``crypto.wrap`` checks the rows before each wrap (memories.keyring.master_key_retired_check), so a process
    still configured with a retired key, even one that verified it before the rotation, refuses to wrap a new key
    that a process holding only the new key could never open.
    """

    master_key_id = models.CharField(max_length=16, help_text="id of the master key it rotated to")
    retired_key_ids = models.JSONField(default=list, help_text="ids of the master keys it re-wrapped away from")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        triggers = append_only_triggers("masterkeyrotation_")

    def __str__(self) -> str:
        return f"rotation to master key {self.master_key_id} retiring {', '.join(self.retired_key_ids) or 'none'}"


class Subject(AppendOnlyModel):
    """A person memories are about, within one scope. Holds its wrapped data key until shredded (one way).

    The subject model: a subject belongs to one scope. The same external id in two scopes is two
    subjects with two keys, so a client granted scope C can erase only C's ``bob`` and learns nothing
    about a ``bob`` elsewhere; erasing an id in every scope is an operator action (an erasure request
    without a scope, its own permission). Rows created before subjects were per scope have no scope
    (legacy, global): they keep opening their memories, are erased by an operator's erasure everywhere,
    and by a client's only when every scope holding their memories is granted to that client.

    A shredded subject stays shredded: appending for it in its scope is refused (409 naming `subject`)
    rather than silently creating a new key, because new facts filed under an erased person's id would
    undo the erasure's intent. A client that truly has a new person uses a new external id.
    External ids are stored in Unicode NFC (memories.services.subject_id_validate), so "josé" typed
    composed or decomposed is one subject.
    """

    scope = models.ForeignKey(Scope, on_delete=models.PROTECT, null=True, blank=True, related_name="subjects")
    external_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    # nonce (12 bytes) + AES-GCM(master key, data key); NULL once shredded.
    wrapped_key = models.BinaryField(null=True)
    wrapped_by = models.CharField(max_length=16, help_text="id of the master key that wrapped it")
    shredded_at = models.DateTimeField(null=True, blank=True)
    key_generation = models.PositiveIntegerField(default=1)  # + 1 on each re-key (see ScopeKey)

    class Meta:
        ordering = ["external_id"]
        constraints = [
            models.UniqueConstraint(fields=["scope", "external_id"], name="memories_subject_unique_per_scope"),
            # legacy rows (no scope) stay unique by external id, as they were
            models.UniqueConstraint(
                fields=["external_id"], condition=models.Q(scope__isnull=True), name="memories_subject_unique_legacy"
            ),
            key_xor_shredded("memories_subject_key_xor_shredded"),
        ]
        triggers = [
            rewrap_rekey_or_shred_trigger(
                "NEW.id = OLD.id AND NEW.external_id = OLD.external_id AND NEW.created_at = OLD.created_at"
                " AND NEW.scope_id IS NOT DISTINCT FROM OLD.scope_id"
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    def __str__(self) -> str:
        return f"{self.external_id} ({self.scope.name if self.scope_id else 'legacy, every scope'})"

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None


class MemoryKey(AppendOnlyModel):
    """A memory's own data key, wrapped by its subject's key (or its scope's key without a subject).

    The log row stays immutable; this row is what forgetting one memory destroys (a one-way shred, like a
    subject's). Besides the shred it changes only when its parent is re-keyed (key_generation + 1, a new
    wrapping of the same memory key). ``resealed`` holds, for a memory appended before memories had own keys,
    a copy of its content sealed under this key (the log row's ciphertext was sealed with the parent's old
    key, which the backfill that created this row destroyed); NULL for memories sealed with their own key.
    """

    memory = models.OneToOneField(
        "Memory", on_delete=models.PROTECT, to_field="seq", db_column="seq", related_name="own_key", primary_key=True
    )
    # nonce (12 bytes) + AES-GCM(parent data key, memory key, aad=crypto.memory_key_aad); NULL once shredded.
    wrapped_key = models.BinaryField(null=True)
    key_generation = models.PositiveIntegerField(default=1)  # the parent's key_generation that wrapped it
    resealed = models.BinaryField(null=True)
    created_at = models.DateTimeField(default=timezone.now)
    shredded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(shredded_at__isnull=True, wrapped_key__isnull=False)
                | models.Q(shredded_at__isnull=False, wrapped_key__isnull=True, resealed__isnull=True),
                name="memories_memorykey_key_xor_shredded",
            ),
        ]
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition(
                    "NOT (((OLD.shredded_at IS NULL AND NEW.shredded_at IS NOT NULL AND NEW.wrapped_key IS NULL"
                    " AND NEW.resealed IS NULL AND NEW.key_generation = OLD.key_generation)"
                    " OR (OLD.shredded_at IS NULL AND NEW.shredded_at IS NULL AND NEW.wrapped_key IS NOT NULL"
                    " AND NEW.key_generation = OLD.key_generation + 1"
                    " AND NEW.resealed IS NOT DISTINCT FROM OLD.resealed))"
                    " AND NEW.seq = OLD.seq AND NEW.created_at = OLD.created_at)"
                ),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]

    @property
    def is_shredded(self) -> bool:
        return self.shredded_at is not None
