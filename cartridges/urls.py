"""Cartridge API routes, mounted at /api/v1/ and its deprecated alias /api/ (mnesio_site.urls; see cartridges.api.views)."""
from __future__ import annotations

from django.urls import path, re_path

from cartridges.api import views

urlpatterns = [
    path("scopes/<str:scope>/cartridges/", views.CartridgeVersionListView.as_view(), name="cartridge-list"),
    path("scopes/<str:scope>/cartridges/compile/", views.CartridgeCompileView.as_view(), name="cartridge-compile"),
    path("scopes/<str:scope>/cartridges/rollback/", views.CartridgeRollbackView.as_view(), name="cartridge-rollback"),
    path("scopes/<str:scope>/cartridges/<int:pk>/", views.CartridgeVersionDetailView.as_view(), name="cartridge-detail"),
    path(
        "scopes/<str:scope>/cartridges/<int:pk>/evaluate/",
        views.CartridgeEvaluateView.as_view(),
        name="cartridge-evaluate",
    ),
    path(
        "scopes/<str:scope>/cartridges/<int:pk>/activate/",
        views.CartridgeActivateView.as_view(),
        name="cartridge-activate",
    ),
    path("scopes/<str:scope>/settings/", views.ScopeSettingsView.as_view(), name="scope-settings"),
    path("scopes/<str:scope>/ask/", views.AskView.as_view(), name="scope-ask"),
    path("scopes/<str:scope>/answers/<int:pk>/", views.AnswerRequestView.as_view(), name="answer-request"),
    path("scopes/<str:scope>/evaluation-cases/", views.EvaluationCaseListView.as_view(), name="evaluation-cases"),
    path("kv/configuration/", views.KvConfigurationView.as_view(), name="kv-configuration"),
    # Both spellings: /api/kv/metrics without the slash, and with it as DRF's other routes are.
    re_path(r"^kv/metrics/?$", views.KvMetricsView.as_view(), name="kv-metrics"),
]
