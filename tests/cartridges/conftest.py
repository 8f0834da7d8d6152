"""Fixtures of the cartridge tests: blobs in a temp dir, the fake engine by default, helpers to build logs."""
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


def stored_files(root) -> list:
    """Every blob file under the storage root."""
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def share_block_secret(*, source, target) -> None:
    """Give ``target`` (before its first compile) the block-id secret of ``source``: the two scopes' block ids, and so
    their cartridges' bytes, are then equal for equal logs (by design they differ between scopes)."""
    from cartridges.models import ScopeBlockSecret
    from cartridges.services.blocksecret import block_secret_aad, scope_block_secret
    from memories import crypto

    wrapped, wrapped_by = crypto.wrap(scope_block_secret(scope=source), aad=block_secret_aad(target.pk))
    ScopeBlockSecret.objects.create(scope=target, wrapped_key=wrapped, wrapped_by=wrapped_by)
