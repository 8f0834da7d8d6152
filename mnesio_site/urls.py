"""URL layout: /api/v1/ (DRF, versioned), /api/ (its deprecated alias), /api/schema/ (OpenAPI), /v1/ (OpenAI-compatible), /admin/, the app pages.

Versioning: the API lives under ``/api/v1/``. The unversioned ``/api/...`` paths serve the very
same views (one include of the same URL modules, so a route added to memories.urls or cartridges.urls
appears under both) and stay as a documented, deprecated alias: the OpenAPI schema documents only
``/api/v1/`` (mnesio_site.versioning.v1_endpoints_only) and every alias response carries ``Deprecation:
true`` and a ``Link: <...>; rel="successor-version"`` header (mnesio_site.versioning.AliasDeprecationMiddleware).
The alias is mounted in its own namespace, so ``reverse("scope-memories", ...)`` gives the v1 path and
``reverse("api-unversioned:scope-memories", ...)`` the alias.
"""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from mnesio_site.versioning import UNVERSIONED_NAMESPACE

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("api/v1/", include("mnesio_site.api_urls")),
    # the deprecated alias: the same routes, namespaced so plain names reverse to /api/v1/
    path("api/", include(("mnesio_site.api_urls", "api"), namespace=UNVERSIONED_NAMESPACE)),
    path("v1/", include("cartridges.openai_urls")),  # OpenAI-compatible (cartridges.api.openai_compat)
    path("", include("cartridges.pages")),
]

# An unmatched /api/ path answers a JSON error with a code, like every API error (core.errors).
handler404 = "core.errors.api_not_found"
