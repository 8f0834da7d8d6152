"""Admin for the cartridge lifecycle: read-only versions with their history, actions that go through the
services (compile, evaluate, activate through the gate, roll back), the runtime configuration switch, and
the KV metrics panel on the admin index (templates/admin/index.html, cartridges.templatetags.kv_admin).

Nothing here edits a lifecycle row: every action is a service call with ``actor=request.user``, and a
failed gate is shown as an error message listing every reason. Memory text never appears.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from memories.models import Scope

from . import blocks, cases, configuration, scope_settings, versions
from .common import ACTIVATE_PERMISSION, COMPILE_PERMISSION
from .versions import ScopeVersionInline, compile_scopes, rollback_scopes

__all__ = ["blocks", "cases", "configuration", "scope_settings", "versions"]


# ---------------------------------------------------------------------------
# The memories app's Scope admin gains the compile and rollback actions and the versions inline
# (memories never imports cartridges; cartridges extends its admin from here).
# ---------------------------------------------------------------------------
def _extend_scope_admin() -> None:
    scope_admin = admin.site._registry.get(Scope)
    if scope_admin is None:  # memories registers it; keep working without it
        return
    scope_admin.actions = [*(scope_admin.actions or []), compile_scopes, rollback_scopes]
    # the permission checks its actions name (instance attributes: called with the request only)
    scope_admin.has_compile_cartridge_permission = lambda request: request.user.has_perm(COMPILE_PERMISSION)
    scope_admin.has_activate_cartridge_permission = lambda request: request.user.has_perm(ACTIVATE_PERMISSION)
    base_get_inlines = scope_admin.get_inlines

    def get_inlines(request: HttpRequest, obj: Any = None) -> list:
        # A scope being added has no versions: leaving the inline off the add form keeps its POST
        # free of this formset's management fields.
        inlines = list(base_get_inlines(request, obj))
        return [*inlines, ScopeVersionInline] if obj is not None else inlines

    scope_admin.get_inlines = get_inlines


_extend_scope_admin()
