"""Fixtures of the API, dashboard and admin tests: the fake engine and eager tasks by default, blobs in a
temp dir, and a helper that builds a scope with an active cartridge (operator and append: tests/conftest.py)."""
from __future__ import annotations

import pytest

# Every test's cartridge blobs in its own temp dir (autouse): the cartridges tests' fixture.
from tests.cartridges.conftest import blob_root  # noqa: F401


@pytest.fixture(autouse=True)
def fake_engine(settings):
    """The fake, torch-free backend as the settings-default configuration; an empty cartridge LRU."""
    from cartridges import engine

    settings.MNESIO_KV_BACKEND = "fake"
    settings.MNESIO_KV_MODEL = "fake-model"
    settings.MNESIO_KV_DTYPE = "f32"
    settings.MNESIO_KV_QUANT = "none"
    engine.cache_clear()
    yield ("fake", "fake-model", "f32", "none")
    engine.cache_clear()


@pytest.fixture(autouse=True)
def eager_tasks(eager_tasks):
    """Run Celery tasks in-process here by default (the shared fixture, made autouse): no worker in these tests."""
    return eager_tasks


@pytest.fixture
def served(append):
    """Build a scope with an active cartridge: served(scope, [texts]) -> CartridgeVersion."""
    from cartridges.services import cartridge_activate, cartridge_compile

    def do(scope, texts, subject=None):
        for text in texts:
            append(scope, text, subject)
        version = cartridge_compile(scope=scope)
        cartridge_activate(version=version)
        return version

    return do
