"""Fixtures of the API, dashboard and admin tests: the fake engine, eager tasks, blobs in a temp dir,
an operator (staff) account, and a helper that builds a scope with an active cartridge."""
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
def eager_tasks():
    """Run Celery tasks in-process (the embedded default's mode): no worker in these tests."""
    from mnesio_site.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


@pytest.fixture
def operator(db):
    """A staff user (an operator) with no scope grants."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user(
        username="olga", email="olga@example.com", password="x-olga-operator", is_staff=True
    )


@pytest.fixture
def append():
    """Append memories: append(scope, "text", subject=None) -> Memory."""
    from memories.services import memory_append

    def do(scope, content, subject=None):
        return memory_append(scope=scope, subject=subject, content=content)

    return do


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


def token_client(user):
    """A DRF APIClient authenticated with ``user``'s token (for tests that need one without the fixture)."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def tamper(version) -> None:
    """Flip one byte of a version's stored blob in place (the gate must refuse it)."""
    from cartridges.storage import blob_storage

    path = blob_storage().path(version.storage_name)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))
