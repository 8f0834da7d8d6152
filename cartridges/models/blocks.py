"""The stored blocks of a scope's cartridges, which versions use them, and their destruction and pruning."""
from __future__ import annotations

from django.db import models

from core.models import AppendOnlyModel, append_only_triggers, blank_only_trigger


class CartridgeBlock(AppendOnlyModel):
    """One stored block of a scope's cartridges (kvengine/blocks.py): content-addressed by its chain id.

    Its bytes are a blob like a version's (sealed under a key of its own, wrapped by the master key: the
    BlobKey row of the same storage_name); the block is live while that key row exists. Versions that
    share a block reference this one row (CartridgeVersionBlock), so each block is stored once per scope.
    Blocks are per scope, never shared across scopes: a tenant cannot learn another scope's content by reuse.
    """

    scope = models.ForeignKey("memories.Scope", on_delete=models.PROTECT, related_name="+")
    # blank once the block is destroyed (block_destroy), as are part_sha256 and sha256
    block_id = models.CharField(max_length=64, help_text="chain id: HMAC-SHA256 under the scope's block secret over parent id, key, position and token ids")
    first_position = models.PositiveIntegerField()
    num_tokens = models.PositiveIntegerField()
    part_sha256 = models.CharField(max_length=64, help_text="digest of the block part (tensor index and data)")
    sha256 = models.CharField(max_length=64, help_text="sha256 of the block part file")
    size_bytes = models.PositiveBigIntegerField()
    stored_sha256 = models.CharField(max_length=64)
    stored_size_bytes = models.PositiveBigIntegerField()
    storage_name = models.CharField(max_length=300, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # the one change allowed: destruction blanks the id and digests (services/destroy.py block_destroy)
        triggers = [
            blank_only_trigger("cartridgeblock_protect_update", blanked=["block_id", "part_sha256", "sha256"]),
            *[t for t in append_only_triggers("cartridgeblock_") if t.name != "cartridgeblock_protect_update"],
        ]
        indexes = [models.Index(fields=["scope", "block_id"], name="cartridges_block_lookup")]

    def __str__(self) -> str:
        return f"block {self.block_id[:12]} of scope {self.scope_id} at {self.first_position}"


class CartridgeVersionBlock(AppendOnlyModel):
    """Version ``version``'s block number ``index`` is ``block`` (protected, append-only: a version's blocks never change)."""

    version = models.ForeignKey("CartridgeVersion", on_delete=models.PROTECT, related_name="block_links")
    index = models.PositiveIntegerField()
    block = models.ForeignKey(CartridgeBlock, on_delete=models.PROTECT, related_name="version_links")

    class Meta:
        triggers = append_only_triggers("cartridgeversionblock_")
        constraints = [models.UniqueConstraint(fields=["version", "index"], name="cartridge_version_block_unique")]


class CartridgeBlockDestruction(AppendOnlyModel):
    """A block's blob and key were destroyed: by an erasure (its chain held an erased memory) or a prune."""

    block = models.OneToOneField(CartridgeBlock, on_delete=models.PROTECT, related_name="destruction")
    erasure_request = models.ForeignKey(
        "memories.ErasureRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="block_destructions"
    )
    reason = models.CharField(max_length=500)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        triggers = append_only_triggers("cartridgeblockdestruction_")


class CartridgePrune(AppendOnlyModel):
    """A version was pruned by retention: its tail and the blocks no kept version uses are destroyed; the row stays."""

    version = models.OneToOneField("CartridgeVersion", on_delete=models.PROTECT, related_name="prune")
    keep_previous_versions = models.PositiveIntegerField()
    num_blocks_destroyed = models.PositiveIntegerField()
    bytes_freed = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        triggers = append_only_triggers("cartridgeprune_")
