"""The settings loader shared by this folder's settings tests: settings.py run afresh with only the given variables."""
from __future__ import annotations

import base64
import os
import runpy
from pathlib import Path
from typing import Any

import pytest

SETTINGS = Path(__file__).resolve().parents[2] / "mnesio_site" / "settings.py"
PRODUCTION = {"SECRET_KEY": "s" * 60, "MNESIO_MASTER_KEY": base64.urlsafe_b64encode(b"k" * 32).decode()}


@pytest.fixture
def load(monkeypatch, tmp_path):
    """Run settings.py with only the given variables set (production defaults, a temporary DATA_DIR)."""

    def load(**variables: str) -> dict[str, Any]:
        for name in list(os.environ):
            if name.startswith(("MNESIO_", "SECRET_KEY", "CELERY_", "DATABASE_URL", "REDIS_URL", "DB_", "SECURE_",
                                "ALLOWED_HOSTS", "CSRF_", "PROMETHEUS_")):
                monkeypatch.delenv(name)
        for name, value in {"MNESIO_DATA_DIR": str(tmp_path), **PRODUCTION, **variables}.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(SETTINGS))

    return load
