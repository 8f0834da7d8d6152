from __future__ import annotations

from django.apps import AppConfig


class CartridgesConfig(AppConfig):
    name = "cartridges"
    verbose_name = "KV cartridges"

    def ready(self) -> None:
        """Register the erasure rebuilder: memories calls it after shredding a subject's key."""
        from memories.registry import register_view_rebuilder

        from .services.erase import cartridge_views_rebuild

        register_view_rebuilder(cartridge_views_rebuild)
