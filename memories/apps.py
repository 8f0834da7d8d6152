from __future__ import annotations

from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "memories"
    verbose_name = "Memory log"
