"""What every cartridge admin module shares: operator permissions, read-only inlines, messages."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join

from core.jobs import JobOutcome

# Operator permissions (Meta.permissions of CartridgeVersion and KvConfiguration): every action and write
# form needs its own, not only is_staff (a view-only operator sees the history and changes nothing).
COMPILE_PERMISSION = "cartridges.compile_cartridge"
EVALUATE_PERMISSION = "cartridges.evaluate_cartridge"
ACTIVATE_PERMISSION = "cartridges.activate_cartridge"  # activate and roll back
SWITCH_PERMISSION = "cartridges.switch_kvconfiguration"


def reasons_html(reasons: list[str]) -> str:
    return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", ((r,) for r in reasons)))



def outcome_text(outcome: JobOutcome) -> str:
    """Say what a compile or evaluate job came to (core.jobs.JobOutcome), for an admin message."""
    if not outcome.done:
        return f"queued (task {outcome.task_id})"
    if outcome.refusal is not None:
        return f"refused: {outcome.refusal.message}"
    result = outcome.result or {}
    if "version" in result:
        return f"compiled version {result['version']}"
    return f"evaluation {result.get('evaluation')}: {'passed' if result.get('passed') else 'failed'}"


class ReadOnlyAdmin(admin.ModelAdmin):
    """An admin for records nobody edits here: listed and viewed, never added, changed or deleted."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """Shows rows, never adds, edits or deletes them (they are immutable)."""

    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
