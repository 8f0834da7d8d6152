"""Template tags for the admin: the KV metrics panel on the admin index."""
from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("admin/_kv_metrics_panel.html", takes_context=True)
def kv_metrics_panel(context: template.Context) -> dict[str, Any]:
    """Render the KV metrics panel for staff (the admin index is staff-only already)."""
    from cartridges import metrics

    request = context.get("request")
    if request is None or not request.user.is_active or not request.user.is_staff:
        return {"m": None}
    return {"m": metrics.kv_metrics()}
