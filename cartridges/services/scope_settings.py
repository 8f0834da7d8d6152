"""A scope's cartridge settings: auto-refresh policy and retention of previous versions.

A change is a new ScopeSettings row (the newest is in force), written under a lock of the scope row so two
concurrent partial changes both land: the second reads the first's row before merging its own fields.
``layout`` chooses how the scope is answered (services/routed_answer.py); this service stores and validates
the settings, so what a client reads back is what the engine does.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from cartridges.models import MAX_DEBOUNCE_S, MAX_KEEP_PREVIOUS_VERSIONS, AutoRefresh, Layout, ScopeSettings
from cartridges.selectors import scope_settings_get
from core.errors import MnesioError
from memories.models import Scope

logger = logging.getLogger("cartridges")

_UNSET: Any = object()


def _bounded_int(value: object, *, field: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise MnesioError(f"`{field}` has to be an integer from 0 to {maximum} but got {value!r}", extra={"field": field})
    return value


def scope_settings_update(
    *,
    scope: Scope,
    auto_refresh: str = _UNSET,
    auto_refresh_debounce_s: int = _UNSET,
    keep_previous_versions: int | None = _UNSET,
    layout: str = _UNSET,
    actor=None,
) -> ScopeSettings:
    """Change the given settings of ``scope`` (the others keep their value) and return the row now in force."""
    if auto_refresh is not _UNSET and auto_refresh not in AutoRefresh.values:
        raise MnesioError(
            f"`auto_refresh` has to be one of {list(AutoRefresh.values)} but got {auto_refresh!r}",
            extra={"field": "auto_refresh"},
        )
    if layout is not _UNSET and layout not in Layout.values:
        raise MnesioError(f"`layout` has to be one of {list(Layout.values)} but got {layout!r}", extra={"field": "layout"})
    if auto_refresh_debounce_s is not _UNSET:
        _bounded_int(auto_refresh_debounce_s, field="auto_refresh_debounce_s", maximum=MAX_DEBOUNCE_S)
    if keep_previous_versions is not _UNSET and keep_previous_versions is not None:
        _bounded_int(keep_previous_versions, field="keep_previous_versions", maximum=MAX_KEEP_PREVIOUS_VERSIONS)
    with transaction.atomic():
        Scope.objects.select_for_update().filter(pk=scope.pk).first()  # one change of this scope's settings at a time
        current = scope_settings_get(scope=scope)
        row = ScopeSettings.objects.create(
            scope=scope,
            auto_refresh=current.auto_refresh if auto_refresh is _UNSET else auto_refresh,
            auto_refresh_debounce_s=(
                current.auto_refresh_debounce_s if auto_refresh_debounce_s is _UNSET else auto_refresh_debounce_s
            ),
            keep_previous_versions=(
                current.keep_previous_versions if keep_previous_versions is _UNSET else keep_previous_versions
            ),
            layout=current.layout if layout is _UNSET else layout,
            created_by=actor if getattr(actor, "pk", None) else None,
        )
    logger.info(
        "scope settings changed scope=%s auto_refresh=%s debounce_s=%s keep_previous_versions=%s layout=%s actor=%s",
        scope.name, row.auto_refresh, row.auto_refresh_debounce_s, row.keep_previous_versions, row.layout, getattr(actor, "pk", None),
    )
    return row
