"""The log itself: the one-row seq counter and the memories, each sealed (never plaintext)."""
from __future__ import annotations

import pgtrigger
from django.db import models
from django.utils import timezone

from core.models import AppendOnlyModel, append_only_triggers, reject_truncate
from memories.models.keys import Subject
from memories.models.scopes import Scope


class LogHead(AppendOnlyModel):
    """The one-row seq counter: appends lock it, so seqs are handed out in commit order without gaps.

    A batch append moves it by the number of rows it inserts, in one UPDATE, so the trigger lets it move
    forward by any amount. That the rows behind it exist is the append code's guarantee (the same transaction
    inserts them).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    head = models.PositiveBigIntegerField(default=0)

    class Meta:
        triggers = [
            pgtrigger.Protect(
                name="protect_update",
                operation=pgtrigger.Update,
                condition=pgtrigger.Condition("NOT (NEW.head > OLD.head AND NEW.id = OLD.id)"),
            ),
            pgtrigger.Protect(name="protect_delete", operation=pgtrigger.Delete),
            reject_truncate("protect_truncate"),
        ]


class Memory(AppendOnlyModel):
    """One entry of the log: a global position, where it belongs, and its sealed content (never plaintext)."""

    seq = models.PositiveBigIntegerField(unique=True)
    scope = models.ForeignKey(Scope, on_delete=models.PROTECT, related_name="memories")
    subject = models.ForeignKey(Subject, on_delete=models.PROTECT, null=True, blank=True, related_name="memories")
    created_at = models.DateTimeField(default=timezone.now)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)
    nonce = models.BinaryField(max_length=12)
    # AES-256-GCM(data key, utf-8 content, aad=(seq, scope, subject)) with the 16-byte tag appended. The data key
    # is the memory's own key (MemoryKey) for memories appended since memories had one, else (legacy) its
    # subject's or scope's key.
    ciphertext = models.BinaryField()
    # The optional metadata (canonical JSON), sealed with the memory's own key (crypto.seal_box, aad
    # memory_metadata_aad); NULL when there is none. Never stored in plaintext.
    metadata_box = models.BinaryField(null=True, blank=True)

    class Meta:
        ordering = ["seq"]
        verbose_name_plural = "memories"
        constraints = [
            models.UniqueConstraint(fields=["scope", "idempotency_key"], name="memories_memory_idempotency_unique"),
            models.CheckConstraint(condition=models.Q(seq__gte=1), name="memories_memory_seq_positive"),
        ]
        indexes = [models.Index(fields=["scope", "seq"], name="memories_memory_scope_seq")]
        triggers = append_only_triggers()

    def __str__(self) -> str:
        return f"memory #{self.seq}"
