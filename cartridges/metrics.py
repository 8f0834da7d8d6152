"""KV metrics: one selector read by /api/kv/metrics, the dashboard and the admin panel.

``kv_metrics()`` returns plain JSON-ready values (ints, floats, strings, ISO timestamps); its shape is the
API's documented response (see ``cartridges.api.serializers.KvMetricsSerializer``), and
``cartridges.prometheus`` turns the same dict into Prometheus text.
No memory text, question or answer ever appears here: only counts, ids, sizes and timings.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db.models import Count, Max, Min, OuterRef, Q, QuerySet, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Length
from django.utils import timezone

from cartridges import conf, engine, selectors
from cartridges.chunk_cache import routed_chunk_cache_stats
from cartridges.models import (
    AnswerRecord,
    CartridgeActivation,
    CartridgeEvaluation,
    CartridgeVersion,
    Layout,
    RoutedChunk,
    ScopeSettings,
)
from cartridges.services.admission import asks_summary
from kvengine import ANSWER_MODES
from memories.models import ErasureEvent, ErasureRequest, ErasureStatus, Memory, Scope
from memories.selectors import log_head

# How many recent answers per mode the latency percentiles are computed over (the "recent window").
LATENCY_WINDOW = 200
# How many gate results the "recent" list shows.
RECENT_GATE_RESULTS = 10
MODES = ANSWER_MODES  # defined once, in the engine


def percentile(values: Sequence[float], p: float) -> float | None:
    """Return the nearest-rank ``p``-th percentile (0 < p <= 100) of ``values``, or None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))  # nearest rank: the smallest value with >= p% at or below it
    return float(ordered[rank - 1])


def latency_summary(rows: Iterable[tuple[float | None, float]]) -> dict[str, Any]:
    """Summarize (ttft_s, total_s) pairs as count plus p50/p95 of each."""
    rows = list(rows)
    ttft = [t for t, _ in rows if t is not None]
    total = [t for _, t in rows if t is not None]
    return {
        "count": len(rows),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "total_p50_s": percentile(total, 50),
        "total_p95_s": percentile(total, 95),
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def configuration_summary() -> dict[str, Any]:
    """Describe the active KV configuration: the newest operator switch, else the MNESIO_KV_* settings."""
    config = selectors.active_configuration()
    device = config.device
    # The real device ("cpu", "cuda:0") is known once this process loaded the backend; never load it here.
    if config.key() in engine.cache_info()["backends_loaded"]:
        device = engine.backend_for(config).describe().device
    row = config.row
    return {
        "id": row.pk if row else None,
        "source": "switch" if row else "settings",
        "backend": config.backend,
        "model": config.model,
        "dtype": config.dtype,
        "quant": config.quant,
        "device": device,
        "created_at": _iso(row.created_at) if row else None,
        "created_by": row.created_by.get_username() if row and row.created_by else None,
    }


def kv_metrics(*, scopes: Iterable[Any] | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Collect the KV metrics over ``scopes`` (None: every scope, the operator's view), in a fixed number of queries."""
    now = now or timezone.now()
    scope_qs = Scope.objects.all() if scopes is None else Scope.objects.filter(pk__in=[s.pk for s in scopes])
    scope_list = list(_scopes_with_metrics(scope_qs).order_by("name"))
    scope_ids = [s.pk for s in scope_list]
    erasures = ErasureRequest.objects.all() if scopes is None else ErasureRequest.objects.filter(scope_id__in=scope_ids)
    # a client's view counts from its own scopes' newest memory: the global head would reveal other scopes' activity
    head = log_head() if scopes is None else (Memory.objects.filter(scope_id__in=scope_ids).aggregate(h=Max("seq"))["h"] or 0)
    serving = _serving_versions(scope_list)
    lags = _lags(serving)
    scope_rows = [_scope_row(scope, serving.get(scope.pk), lags, now, head) for scope in scope_list]
    return {
        "generated_at": _iso(now),
        "log_head": head,
        "configuration": configuration_summary(),
        "scopes": scope_rows,
        "gate": _gate(CartridgeEvaluation.objects.filter(version__scope_id__in=scope_ids)),
        "latency": _latency(AnswerRecord.objects.filter(scope_id__in=scope_ids)),
        "versions": {
            **_version_counts(CartridgeVersion.objects.filter(scope_id__in=scope_ids)),
            "active": sum(1 for row in scope_rows if row["serving"]),
        },
        "sizes_by_quant": _sizes_by_quant(CartridgeVersion.objects.filter(scope_id__in=scope_ids)),
        "erasures": _erasures(erasures),
        "asks": asks_summary(),
        "routed": {  # the routed layout's settings and this process's LRU of opened chunks
            "repair": conf.routed_repair(), "chunk_quant": conf.routed_chunk_quant(), "top_k": conf.routed_top_k(),
            "token_budget": conf.routed_token_budget(), "chunk_cache": routed_chunk_cache_stats(),
        },  # this process's: the answer slots held now (a 429 tells any asker as much)
    }


def _scopes_with_metrics(scopes: QuerySet[Scope]) -> QuerySet[Scope]:
    """Scopes annotated with their memory count and head and the version of their newest activation (one query)."""
    newest_activation = CartridgeActivation.objects.filter(scope=OuterRef("pk")).order_by("-created_at", "-id")
    memories = Memory.objects.filter(scope=OuterRef("pk")).order_by().values("scope_id")
    chunks = RoutedChunk.objects.filter(scope=OuterRef("pk")).order_by().values("scope_id")
    return scopes.annotate(
        num_memories=Coalesce(Subquery(memories.annotate(n=Count("id")).values("n")), 0),
        memories_head=Coalesce(Subquery(memories.annotate(h=Max("seq")).values("h")), 0),
        oldest_memory_at=Subquery(memories.annotate(o=Min("created_at")).values("o")),  # an unserved scope's lag_s
        activated_version_id=Subquery(newest_activation.values("version_id")[:1]),
        layout=Coalesce(Subquery(ScopeSettings.objects.filter(scope=OuterRef("pk")).order_by("-id").values("layout")[:1]),
                        Value(Layout.AUTO.value)),
        num_routed_chunks=Coalesce(Subquery(chunks.annotate(n=Count("id")).values("n")), 0),
        routed_chunk_bytes=Coalesce(Subquery(chunks.annotate(b=Sum(Length("sealed"))).values("b")), 0),
    )


def _serving_versions(scopes: list[Any]) -> dict[int, CartridgeVersion]:
    """The version serving each scope (``selectors.active_version``'s rule), by scope id, in a fixed number of queries."""
    activated = [s.activated_version_id for s in scopes if s.activated_version_id is not None]
    if not activated:
        return {}
    versions = list(selectors.versions_with_state(CartridgeVersion.objects.filter(pk__in=activated)))
    serving = selectors.versions_serving(versions)
    return {v.scope_id: v for v in versions if v.pk in serving}


def _lags(serving: dict[int, CartridgeVersion]) -> dict[int, tuple[int, datetime]]:
    """Memories of each served scope after its serving version's head and when the oldest of them was appended
    (one query); unserved scopes lag by all their memories."""
    if not serving:
        return {}
    after = Q(pk__in=[])
    for scope_id, version in serving.items():
        after |= Q(scope_id=scope_id, seq__gt=version.log_head)
    rows = Memory.objects.filter(after).values("scope_id").annotate(n=Count("id"), oldest=Min("created_at")).order_by()
    return {row["scope_id"]: (row["n"], row["oldest"]) for row in rows}


def _lag_seconds(oldest: datetime | None, now: datetime) -> float:
    """Seconds the oldest memory not yet served has waited (0 when every memory is served)."""
    return 0.0 if oldest is None else round(max(0.0, (now - oldest).total_seconds()), 3)


def _scope_row(scope: Any, version: CartridgeVersion | None, lags: dict[int, tuple[int, datetime]], now: datetime, head: int) -> dict[str, Any]:
    """One scope: the version serving it (if any), the latest activation's version, and the lag."""
    lag, oldest = lags.get(scope.pk, (0, None)) if version is not None else (scope.num_memories, scope.oldest_memory_at)
    return {
        "scope": scope.name,
        "num_memories": scope.num_memories,
        "scope_head": scope.memories_head,
        # memories of the scope the serving cartridge does not hold (all of them when none serves)
        "lag": lag,
        # how long the oldest of those has waited to be served (0: the cartridge holds the whole log)
        "lag_s": _lag_seconds(oldest, now),
        "serving": version is not None,
        # the layout setting (auto: prefix while a prefix cartridge serves, routed past the window) and its chunks
        "layout": scope.layout,
        "routed_chunks": {"count": scope.num_routed_chunks, "size_bytes": scope.routed_chunk_bytes},
        "activated_version_id": scope.activated_version_id,
        "active_version": None if version is None else {
            "id": version.pk,
            "log_head": version.log_head,
            "num_tokens": version.num_tokens,
            "num_memories": version.num_memories,
            "size_bytes": version.size_bytes,
            "dtype": version.dtype,
            "quant": version.quant,
            "created_at": _iso(version.created_at),
            "age_s": round((now - version.created_at).total_seconds(), 3),
            # how far behind the view's head it was compiled (the global head for operators, the client's scopes' otherwise)
            "log_head_lag": head - version.log_head,
        },
    }


def _gate(evaluations: Any) -> dict[str, Any]:
    """Gate outcomes: counts of passed/failed evaluations and the most recent ones with their reasons."""
    counts = evaluations.aggregate(
        num_passed=Count("id", filter=Q(passed=True)), num_failed=Count("id", filter=Q(passed=False))
    )
    recent = []
    for ev in evaluations.select_related("version__scope").order_by("-created_at", "-id")[:RECENT_GATE_RESULTS]:
        figures = ev.figures or {}
        fidelity = figures.get("fidelity") if isinstance(figures.get("fidelity"), dict) else {}
        accuracy = figures.get("accuracy") if isinstance(figures.get("accuracy"), dict) else {}
        recent.append({
            "evaluation_id": ev.pk,
            "version_id": ev.version_id,
            "scope": ev.version.scope.name,
            "passed": ev.passed,
            "reasons": list(ev.reasons or []),
            "stage": figures.get("stage", "evaluate"),
            # which gate ran ("full" | "incremental"; None for a check-only record) and its cost in seconds
            "gate": figures.get("gate") if isinstance(figures.get("gate"), str) else None,
            "gate_seconds": (figures.get("gate_cost") or {}).get("seconds") if isinstance(figures.get("gate_cost"), dict) else None,
            "fidelity": fidelity.get("top1_agreement"),
            "accuracy_cartridge": accuracy.get("cartridge"),
            "accuracy_text": accuracy.get("text"),
            "created_at": _iso(ev.created_at),
        })
    return {"passed": counts["num_passed"], "failed": counts["num_failed"], "recent": recent}


def _recent_answers(records: Any, mode: str, window: int) -> list[tuple[float, float]]:
    """(ttft_s, total_s) of the newest ``window`` answers of ``mode``, oldest first."""
    rows = list(records.filter(mode=mode).order_by("-created_at", "-id").values_list("ttft_s", "total_s")[:window])
    return rows[::-1]


def _latency(records: Any, *, window: int = LATENCY_WINDOW) -> dict[str, Any]:
    """p50/p95 of time-to-first-token and total answer time per mode over the recent window."""
    return {"window": window, **{mode: latency_summary(_recent_answers(records, mode, window)) for mode in MODES}}


def latency_series(*, scopes: Iterable[Any] | None = None, window: int = 50) -> dict[str, list[float]]:
    """Total seconds of the newest ``window`` answers per mode, oldest first (the dashboard's chart)."""
    records = AnswerRecord.objects.all()
    if scopes is not None:
        records = records.filter(scope_id__in=[s.pk for s in scopes])
    return {mode: [total for _, total in _recent_answers(records, mode, window)] for mode in MODES}


def _version_counts(versions: Any) -> dict[str, int]:
    """Versions compiled (every row), failed (newest evaluation failed) and destroyed."""
    newest = CartridgeEvaluation.objects.filter(version=OuterRef("pk")).order_by("-created_at", "-id").values("passed")[:1]
    counts = versions.annotate(last_passed=Subquery(newest)).aggregate(
        compiled=Count("id"),
        failed=Count("id", filter=Q(last_passed=False)),
        destroyed=Count("id", filter=Q(destruction__isnull=False)),
    )
    return counts


def _sizes_by_quant(versions: Any) -> list[dict[str, Any]]:
    """Stored (not destroyed) cartridge blobs per quant: count, total and mean size in bytes."""
    rows = (
        versions.filter(destruction__isnull=True)
        .values("quant")
        .annotate(count=Count("id"), total_bytes=Sum("size_bytes"))
        .order_by("quant")
    )
    return [
        {"quant": r["quant"], "count": r["count"], "total_bytes": r["total_bytes"] or 0,
         "mean_bytes": round((r["total_bytes"] or 0) / r["count"]) if r["count"] else 0}
        for r in rows
    ]


def _erasures(requests: Any) -> dict[str, int]:
    """Count erasure requests by their newest event: pending (requested / keys shredded), done, failed."""
    latest = ErasureEvent.objects.filter(request=OuterRef("pk")).order_by("-id").values("status")[:1]
    rows = requests.annotate(status=Subquery(latest)).values("status").annotate(n=Count("id"))
    by_status = {row["status"]: row["n"] for row in rows}
    done = by_status.pop(ErasureStatus.VIEWS_REBUILT, 0)
    failed = by_status.pop(ErasureStatus.FAILED, 0)
    return {"pending": sum(by_status.values()), "done": done, "failed": failed}
