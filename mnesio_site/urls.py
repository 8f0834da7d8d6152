"""URL layout: /api/ (DRF), /api/schema/ (OpenAPI), /admin/, and the app pages."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="schema"), name="api-redoc"),
    path("api/", include("memories.urls")),
    path("api/", include("cartridges.urls")),
    path("", include("cartridges.pages")),
]

# An unmatched /api/ path answers a JSON error with a code, like every API error (core.errors).
handler404 = "core.errors.api_not_found"
