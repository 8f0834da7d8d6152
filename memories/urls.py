"""Memories API routes, mounted at /api/v1/ and its deprecated alias /api/ (mnesio_site.urls; see memories.api.views)."""
from __future__ import annotations

from django.urls import path

from memories.api import accounts, views

urlpatterns = [
    path("tokens/", accounts.TokenListView.as_view(), name="token-list"),
    path("tokens/<str:token_id>/", accounts.TokenDetailView.as_view(), name="token-detail"),
    path("users/", accounts.UserInviteView.as_view(), name="user-invite"),
    path("scopes/", views.ScopeListView.as_view(), name="scope-list"),
    path("scopes/<str:scope>/", views.ScopeDeleteView.as_view(), name="scope-delete"),
    path("scopes/<str:scope>/grants/", views.ScopeGrantsView.as_view(), name="scope-grants"),
    path("scopes/<str:scope>/grants/<str:username>/", views.ScopeGrantDetailView.as_view(), name="scope-grant-detail"),
    path("scopes/<str:scope>/head/", views.ScopeHeadView.as_view(), name="scope-head"),
    path("scopes/<str:scope>/memories/", views.ScopeMemoriesView.as_view(), name="scope-memories"),
    path("scopes/<str:scope>/memories/batch/", views.ScopeMemoriesBatchView.as_view(), name="scope-memories-batch"),
    path("scopes/<str:scope>/memories/<int:seq>/", views.MemoryDetailView.as_view(), name="memory-detail"),
    path("scopes/<str:scope>/search/", views.MemorySearchView.as_view(), name="scope-search"),
    path("scopes/<str:scope>/erasure-requests/", views.ErasureRequestsView.as_view(), name="erasure-requests"),
    path(
        "scopes/<str:scope>/erasure-requests/<int:pk>/",
        views.ErasureRequestDetailView.as_view(),
        name="erasure-request-detail",
    ),
]
