"""Template tags of the KV pages: the metrics panel on the admin index and a few readable formats."""
from __future__ import annotations

from typing import Any

from django import template
from django.utils.dateparse import parse_datetime

register = template.Library()


@register.inclusion_tag("admin/_kv_metrics_panel.html", takes_context=True)
def kv_metrics_panel(context: template.Context) -> dict[str, Any]:
    """Render the KV metrics panel (every scope's figures) for staff holding ``cartridges.view_kv_metrics``."""
    from cartridges import metrics
    from cartridges.api.views import sees_every_scope

    request = context.get("request")
    if request is None or not sees_every_scope(request.user):
        return {"m": None}
    return {"m": metrics.kv_metrics()}


@register.filter
def seconds(value: float | None) -> str:
    """Format a duration in seconds for people: "–", "85 µs", "12.3 ms", "1.42 s"."""
    if value is None:
        return "–"
    if value < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s"


@register.filter
def age(value: float | None) -> str:
    """Format an age in seconds coarsely: "42 s", "5 min", "3 h", "2 d"."""
    if value is None:
        return "–"
    for limit, unit, size in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if value < limit:
            return f"{value / size:.0f} {unit}"
    return f"{value / 86400:.0f} d"


@register.filter
def when(value: str | None) -> str:
    """Format an ISO timestamp as "2026-11-29 17:28:26 UTC"."""
    parsed = parse_datetime(value) if isinstance(value, str) else value
    return parsed.strftime("%Y-%m-%d %H:%M:%S UTC") if parsed else "–"
