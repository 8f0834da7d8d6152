from __future__ import annotations

from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "memories"
    verbose_name = "Memory log"

    def ready(self) -> None:
        """Install the keyring's master-key check around wraps, register the log's wrapped-key tables with the
        keyring, and the master-key database check."""
        from . import checks, crypto  # noqa: F401  (importing checks registers the check)
        from .keyring import WRAP_GUARD, KeyHolder, register_key_holder
        from .search_index import index_key_aad

        crypto.wrap_guard_install(WRAP_GUARD)
        register_key_holder(KeyHolder("memories.Subject", "wrapped_key", "wrapped_by",
                                      lambda row: crypto.subject_key_aad(row.external_id, row.scope_id), "subject keys"))
        register_key_holder(KeyHolder("memories.ScopeKey", "wrapped_key", "wrapped_by",
                                      lambda row: crypto.scope_key_aad(row.scope_id), "scope keys"))
        register_key_holder(KeyHolder("memories.SearchIndex", "wrapped_key", "wrapped_by",
                                      lambda row: index_key_aad(row.scope_id), "search index keys"))
