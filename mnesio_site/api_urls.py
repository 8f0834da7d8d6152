"""The API's routes, one list mounted twice by mnesio_site.urls: at /api/v1/ and at the deprecated /api/ alias."""
from __future__ import annotations

from django.urls import include, path

urlpatterns = [
    path("", include("memories.urls")),
    path("", include("cartridges.urls")),
]
