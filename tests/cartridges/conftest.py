"""Fixtures of the cartridge tests: blobs in a temp dir, the fake engine by default, the real model as the active configuration."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def blob_root(settings, tmp_path):
    """Keep every test's cartridge blobs in its own temp dir (STORAGES["cartridges"])."""
    root = tmp_path / "blobs"
    settings.STORAGES = {
        **settings.STORAGES,
        "cartridges": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(root)}},
    }
    return root


@pytest.fixture
def fake_engine(settings):
    """The settings default configuration: the torch-free fake backend."""
    settings.MNESIO_KV_BACKEND = "fake"
    settings.MNESIO_KV_MODEL = "fake-model"
    settings.MNESIO_KV_DTYPE = "f32"
    settings.MNESIO_KV_QUANT = "none"
    return ("fake", "fake-model", "f32", "none")


@pytest.fixture
def real_engine(settings, real_backend):
    """The real default model (shared session instance) as the active configuration."""
    from cartridges import engine

    settings.MNESIO_KV_BACKEND = "transformers"
    settings.MNESIO_KV_MODEL = "smollm2-135m-instruct"
    settings.MNESIO_KV_DTYPE = "f32"
    settings.MNESIO_KV_QUANT = "none"
    config = ("transformers", "smollm2-135m-instruct", "f32", "none")
    engine.register_backend(config, real_backend)
    return config
