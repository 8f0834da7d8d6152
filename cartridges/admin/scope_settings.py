"""Scope settings in the admin: the history of changes, read-only (changes go through the API's PATCH, which
validates them and records who made each one; an admin edit form would be a second door)."""
from __future__ import annotations

from django.contrib import admin

from cartridges.models import ScopeSettings

from .common import ReadOnlyAdmin


@admin.register(ScopeSettings)
class ScopeSettingsAdmin(ReadOnlyAdmin):
    list_display = ["scope", "layout", "auto_refresh", "auto_refresh_debounce_s", "keep_previous_versions", "created_by",
                    "created_at"]
    list_filter = ["layout", "auto_refresh"]
    search_fields = ["scope__name"]
    list_select_related = ["scope", "created_by"]
