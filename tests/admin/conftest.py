"""The admin tests share the API tests' fixtures (fake engine, eager tasks, blobs in a temp dir)."""
from __future__ import annotations

from tests.api.conftest import append, blob_root, eager_tasks, fake_engine, operator, served  # noqa: F401
