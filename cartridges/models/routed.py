"""The routed layout's rows: one sealed chunk per memory and KV configuration."""
from __future__ import annotations

from django.db import models


class RoutedChunk(models.Model):
    """One memory's chunk of the routed layout under one KV configuration (kvengine.routed), sealed.

    ``sealed`` is the chunk's bytes (kvengine.routed.chunk_dumps) AES-GCM sealed under the memory's own data key
    (memories.selectors.memory_own_keys): shredding that key (the memory forgotten) or the key wrapping it (its
    subject erased, its scope deleted) leaves them unreadable. Every erasure kind also deletes the erased
    memories' rows (services/routed_chunks.py). ``chunk_id`` is an HMAC of the chunk's token ids under the
    scope's block secret (ScopeBlockSecret): it names the chunk without being a guess oracle for its text.
    Compiled once per (memory, configuration) and never changed.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    memory = models.ForeignKey("memories.Memory", on_delete=models.PROTECT, related_name="+")
    config_key = models.CharField(max_length=300, help_text="KvConfig.key the chunk was compiled under")
    chunk_id = models.CharField(max_length=64)
    quant = models.CharField(max_length=8)
    num_tokens = models.PositiveIntegerField()
    sealed = models.BinaryField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["memory", "config_key"], name="cartridges_routedchunk_once")]
        indexes = [models.Index(fields=["scope", "config_key"], name="cartridges_routedchunk_scope")]

    def __str__(self) -> str:
        return f"chunk of memory {self.memory_id} ({self.config_key})"
