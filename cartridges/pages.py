"""Server-rendered pages mounted at /: the KV dashboard (/dashboard/) and the Prometheus scrape path (/metrics).

The dashboard is plain Django templates with inline SVG charts (no front-end build, no CDN: the machines
may be offline). It refreshes itself by fetching its own body fragment every few seconds.
"""
from __future__ import annotations

from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path

from cartridges import metrics
from cartridges.api.views import METRICS_PERMISSION, KvMetricsView, PrometheusRenderer, sees_every_scope
from cartridges.templatetags.kv_admin import seconds

# Seconds between the dashboard's self-refreshes (overridable with ?refresh=N, at least 1).
DEFAULT_REFRESH_S = 10
SERIES_COLORS = {"cartridge": "#2563eb", "text": "#ea580c"}


def _nice_ceiling(value: float) -> float:
    """Round ``value`` up to 1, 2 or 5 times a power of ten, so axis ticks read well."""
    if value <= 0:
        return 1.0
    import math

    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        ceiling = step * 10**exponent
        if ceiling >= value:
            return float(ceiling)
    return float(10 ** (exponent + 1))


def latency_chart(series: dict[str, list[float]], *, width: int = 560, height: int = 220) -> dict[str, Any]:
    """Lay out the cartridge-vs-text latency line chart: SVG polylines, points and y ticks (seconds)."""
    left, right, top, bottom = 64, 12, 12, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    longest = max((len(v) for v in series.values()), default=0)
    y_max = _nice_ceiling(max((max(v) for v in series.values() if v), default=0.0))
    lines = []
    for mode, values in series.items():
        points = []
        for i, value in enumerate(values):
            x = left + (plot_w * i / (longest - 1) if longest > 1 else plot_w / 2)
            y = top + plot_h - plot_h * min(value, y_max) / y_max
            points.append({"x": round(x, 1), "y": round(y, 1), "value": value})
        lines.append({
            "mode": mode,
            "color": SERIES_COLORS.get(mode, "#555"),
            "points": points,
            "polyline": " ".join(f"{p['x']},{p['y']}" for p in points),
        })
    ticks = [{"y": round(top + plot_h - plot_h * f, 1), "label": seconds(y_max * f)} for f in (0, 0.5, 1)]
    return {
        "width": width, "height": height, "left": left, "right": width - right, "top": top,
        "bottom": top + plot_h, "mid_x": left + plot_w // 2, "mid_y": top + plot_h // 2, "lines": lines, "ticks": ticks, "empty": longest == 0, "count": longest,
    }


def size_chart(rows: list[dict[str, Any]], *, width: int = 560, bar_h: int = 22) -> dict[str, Any]:
    """Lay out the "sizes by quant" horizontal bar chart (mean blob size per quant)."""
    label_w, gap = 70, 8
    largest = max((r["mean_bytes"] or 0 for r in rows), default=0) or 1
    bars = []
    for i, row in enumerate(rows):
        bar_w = (width - label_w - 150) * (row["mean_bytes"] or 0) / largest
        bars.append({**row, "x": label_w, "y": i * (bar_h + gap), "w": round(max(bar_w, 1), 1), "h": bar_h,
                     "text_x": round(label_w + max(bar_w, 1) + 6, 1), "text_y": i * (bar_h + gap) + bar_h - 6})
    return {"width": width, "height": max(len(rows), 1) * (bar_h + gap), "bars": bars, "empty": not rows}


def _refresh_seconds(request: HttpRequest) -> int:
    try:
        return max(1, int(request.GET.get("refresh", DEFAULT_REFRESH_S)))
    except ValueError:
        return DEFAULT_REFRESH_S


@staff_member_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Render the KV dashboard (staff with ``cartridges.view_kv_metrics``); ``?fragment=1`` renders just its body."""
    if not sees_every_scope(request.user):  # it shows every scope: staff without the permission see no figure
        raise PermissionDenied(f"the dashboard needs the permission `{METRICS_PERMISSION}`")
    data = metrics.kv_metrics()
    context = {
        "m": data,
        "latency_chart": latency_chart(metrics.latency_series()),
        "size_chart": size_chart(data["sizes_by_quant"]),
        "latency_rows": [(mode, data["latency"][mode]) for mode in metrics.MODES],
        "refresh_s": _refresh_seconds(request),
    }
    template = "cartridges/_dashboard_body.html" if request.GET.get("fragment") else "cartridges/dashboard.html"
    return render(request, template, context)


def home(request: HttpRequest) -> HttpResponse:
    """Send visitors of / to the dashboard."""
    return redirect("dashboard")


# The scrape path: /api/kv/metrics rendered only as Prometheus text (token or session auth, same scoping).
prometheus_metrics = KvMetricsView.as_view(renderer_classes=[PrometheusRenderer])


urlpatterns = [
    path("", home, name="home"),
    path("dashboard/", dashboard, name="dashboard"),
    path("metrics", prometheus_metrics, name="prometheus-metrics"),
]
