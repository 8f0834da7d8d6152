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
        self._route_tasks()

    @staticmethod
    def _route_tasks() -> None:
        """Send compile and evaluate to the gpu queue (kept beside any routes the project sets)."""
        from mnesio_site.celery import app

        from .tasks import TASK_ROUTES

        routes = app.conf.task_routes
        if routes is None or isinstance(routes, dict):
            app.conf.task_routes = {**TASK_ROUTES, **(routes or {})}
