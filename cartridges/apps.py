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
        _purge_on_every_request_and_task()
        # rotate_master_key re-wraps cartridge blob keys in the same run as the subject keys.
        register_key_rewrapper("cartridge blob keys", blob_keys_rewrap)


def _purge_on_every_request_and_task() -> None:
    """Drop cartridges destroyed by other processes at the start of each request and Celery task."""
    from celery.signals import task_prerun
    from django.core.signals import request_started

    request_started.connect(_purge, dispatch_uid="cartridges-purge-request")
    task_prerun.connect(_purge, dispatch_uid="cartridges-purge-task")


def _purge(**_: object) -> None:
    from django.db import DatabaseError

    from .engine import cartridges_purge_destroyed

    try:
        cartridges_purge_destroyed()
    except DatabaseError:  # the request itself meets the database error (a 503); serving re-checks the version
        import logging

        logging.getLogger("cartridges").warning("could not check cached cartridges: the database is unavailable")
