"""Fixtures of the docs' tests: the fake engine, eager tasks, ``served`` and the live uvicorn (ASGI) server."""
from __future__ import annotations

from tests.api.conftest import eager_tasks, fake_engine, served  # noqa: F401 (fixtures, requested by name)
from tests.cartridges.conftest import blob_root  # noqa: F401
from tests.serving.conftest import asgi_server  # noqa: F401
