from __future__ import annotations

from django.apps import AppConfig


class CartridgesConfig(AppConfig):
    name = "cartridges"
    verbose_name = "KV cartridges"
