"""Stored blocks and retention prunes in the admin, read-only: which blocks a scope stores, whether each is live
(its key exists) or destroyed and why, and what retention pruned. No block content is ever shown, nor a full block
id or part digest: ids are keyed per scope (services/blocksecret.py) and only a short prefix is shown, to tell
blocks apart; a destroyed block's id and digests are blank."""
from __future__ import annotations

from django.contrib import admin

from cartridges.models import BlobKey, CartridgeBlock, CartridgePrune

from .common import ReadOnlyAdmin


@admin.register(CartridgeBlock)
class CartridgeBlockAdmin(ReadOnlyAdmin):
    list_display = ["id", "scope", "short_id", "first_position", "num_tokens", "stored_size_bytes", "live", "created_at"]
    search_fields = ["scope__name"]
    list_select_related = ["scope", "destruction"]
    fields = readonly_fields = ["scope", "short_id", "first_position", "num_tokens", "size_bytes", "stored_sha256",
                                "stored_size_bytes", "storage_name", "created_at"]

    @admin.display(description="block id (keyed, first 8 hex)")
    def short_id(self, obj: CartridgeBlock) -> str:
        return obj.block_id[:8] or "(destroyed)"

    @admin.display(boolean=True, description="live")
    def live(self, obj: CartridgeBlock) -> bool:
        return BlobKey.objects.filter(storage_name=obj.storage_name).exists()


@admin.register(CartridgePrune)
class CartridgePruneAdmin(ReadOnlyAdmin):
    list_display = ["version", "keep_previous_versions", "num_blocks_destroyed", "bytes_freed", "created_at"]
    list_select_related = ["version"]
    search_fields = ["version__scope__name"]
