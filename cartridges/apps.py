from __future__ import annotations

from django.apps import AppConfig


class CartridgesConfig(AppConfig):
    name = "cartridges"
    verbose_name = "KV cartridges"

    def ready(self) -> None:
        """Register with memories: the erasure rebuilder and the blob-key re-wrapper for key rotation."""
        from memories.registry import register_key_rewrapper, register_view_rebuilder

        from .services.erase import cartridge_views_rebuild
        from .storage import blob_keys_rewrap

        register_view_rebuilder(cartridge_views_rebuild)
        # rotate_master_key re-wraps cartridge blob keys in the same run as the subject keys.
        register_key_rewrapper("cartridge blob keys", blob_keys_rewrap)
