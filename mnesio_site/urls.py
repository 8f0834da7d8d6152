"""URL layout: /api/ (DRF), /api/schema/ (OpenAPI), /v1/ (OpenAI-compatible), /admin/, and the app pages."""
from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/", include("memories.urls")),
    path("api/", include("cartridges.urls")),
    path("v1/", include("cartridges.openai_urls")),  # OpenAI-compatible (cartridges.api.openai_compat)
    path("", include("cartridges.pages")),
]
