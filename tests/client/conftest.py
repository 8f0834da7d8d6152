"""Fixtures of the Python client's tests: the fake engine, eager tasks and ``served`` of the API tests, and the
live uvicorn (ASGI) server of the serving tests, which the client talks to over real HTTP."""
from __future__ import annotations

from tests.api.conftest import eager_tasks, fake_engine, served  # noqa: F401 (fixtures, requested by name)
from tests.cartridges.conftest import blob_root  # noqa: F401
from tests.serving.conftest import asgi_server, slow_engine  # noqa: F401
