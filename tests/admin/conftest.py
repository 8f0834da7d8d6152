"""The admin tests share the API tests' fixtures (fake engine, eager tasks, blobs in a temp dir)."""
from __future__ import annotations

from tests.api.conftest import blob_root, eager_tasks, fake_engine, served  # noqa: F401
