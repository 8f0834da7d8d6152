"""OpenAI-compatible routes, mounted at /v1/ (see cartridges.api.openai_compat)."""
from __future__ import annotations

from django.urls import path, re_path

from cartridges.api import openai_compat as views

urlpatterns = [
    path("chat/completions", views.ChatCompletionsView.as_view(), name="openai-chat-completions"),
    path("completions", views.CompletionsView.as_view(), name="openai-completions"),
    path("models", views.ModelListView.as_view(), name="openai-models"),
    path("models/<str:model>", views.ModelView.as_view(), name="openai-model"),
    re_path(r"^.*$", views.not_found),
]
