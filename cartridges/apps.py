from __future__ import annotations

from django.apps import AppConfig


class CartridgesConfig(AppConfig):
    name = "cartridges"
    verbose_name = "KV cartridges"

    def ready(self) -> None:
        """Register with memories: the erasure rebuilder, and every table of wrapped keys with the keyring."""
        from memories.keyring import KeyHolder, register_key_holder
        from memories.registry import register_view_rebuilder

        from .selectors import evaluation_case_aad
        from .services.answer_requests import answer_request_aad
        from .services.blocksecret import block_secret_aad
        from .services.erase import cartridge_views_rebuild
        from .storage import blob_key_aad

        register_view_rebuilder(cartridge_views_rebuild)
        from memories.registry import register_append_hook

        from .tasks import refresh_after_append, routed_chunks_after_append

        register_append_hook(refresh_after_append)  # auto-refresh on append (services/refresh.py); idempotent
        register_append_hook(routed_chunks_after_append)  # a routed scope's new chunks, compiled once
        _purge_on_every_request_and_task()
        # rotate_master_key re-wraps these in the same loop as the subject keys; a process whose master key
        # does not know their key ids refuses to write (memories.keyring.master_key_verify).
        register_key_holder(KeyHolder("cartridges.BlobKey", "wrapped_key", "wrapped_by", blob_key_aad,
                                      "cartridge blob keys"))
        register_key_holder(KeyHolder("cartridges.AnswerRequest", "wrapped_key", "wrapped_by",
                                      lambda row: answer_request_aad(row.pk, "key"), "answer request keys"))
        register_key_holder(KeyHolder("cartridges.EvaluationCase", "wrapped_key", "wrapped_by",
                                      lambda row: evaluation_case_aad(row.pk, "key"), "evaluation case keys"))
        register_key_holder(KeyHolder("cartridges.ScopeBlockSecret", "wrapped_key", "wrapped_by",
                                      lambda row: block_secret_aad(row.scope_id), "scope block-id secrets"))


def _purge_on_every_request_and_task() -> None:
    """Drop cartridges destroyed by other processes at the start of each request and Celery task."""
    from celery.signals import task_prerun
    from django.core.signals import request_started

    request_started.connect(_purge, dispatch_uid="cartridges-purge-request")
    task_prerun.connect(_purge, dispatch_uid="cartridges-purge-task")


def _purge(environ: dict | None = None, scope: dict | None = None, **_: object) -> None:
    from django.db import DatabaseError

    # The liveness probe touches nothing but the process (mnesio_site/health.py answers /healthz first): a cached
    # cartridge must not make it query the database. A Celery task and an ASGI request pass no environ.
    path = (environ or {}).get("PATH_INFO") or (scope or {}).get("path")
    if path == "/healthz":
        return

    from .engine import cartridges_purge_destroyed

    try:
        cartridges_purge_destroyed()
    except DatabaseError:  # the request itself meets the database error (a 503); serving re-checks the version
        import logging

        logging.getLogger("cartridges").warning("could not check cached cartridges: the database is unavailable")
