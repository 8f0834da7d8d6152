"""Storage faults: blob storage unwritable during a compile (a clear failure, no version row pointing at
nothing, no stray bytes); a blob truncated, emptied or removed on disk (refused at activation and at load,
with a record). Byte flips and swapped blobs are covered in tests/cartridges/test_gate.py."""
from __future__ import annotations

import errno
import logging

import pytest
from django.core.files.storage import FileSystemStorage

from cartridges.models import CartridgeBlob, CartridgeEvaluation, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import GateFailed, cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.storage import BlobTampered, BlobUnavailable, blob_storage
from memories.services import memory_append

pytestmark = pytest.mark.django_db


class DiskFullStorage(FileSystemStorage):
    """Writes half of the bytes under the real name, then fails as a full disk does (test-only)."""

    def _save(self, name, content):
        data = content.read()
        path = self.path(name)
        import os

        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", path)


def _storage(settings, backend: str, location) -> None:
    settings.STORAGES = {**settings.STORAGES, "cartridges": {"BACKEND": backend, "OPTIONS": {"location": str(location)}}}


def _files(root) -> list:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.fixture
def log_of_cartridges(caplog):
    """Records of the ``cartridges`` logger (it does not propagate to the root)."""
    logger = logging.getLogger("cartridges")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="cartridges")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.parametrize("fault", ["not a directory", "disk full mid-write"])
def test_an_unwritable_blob_storage_fails_the_compile_and_leaves_no_row_or_bytes(settings, tmp_path, scope_a, fake_row, fault):
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    if fault == "not a directory":
        blocker = tmp_path / "blobs-is-a-file"
        blocker.write_text("not a directory")
        root = blocker / "cartridges"
        _storage(settings, "django.core.files.storage.FileSystemStorage", root)
    else:
        root = tmp_path / "full-disk"
        _storage(settings, f"{__name__}.DiskFullStorage", root)
    with pytest.raises(OSError) as exc:
        cartridge_compile(scope=scope_a)
    assert exc.value.errno in (errno.ENOTDIR, errno.ENOSPC)  # the failure says what the storage said
    assert CartridgeVersion.objects.count() == 0  # no version row pointing at nothing
    assert CartridgeBlob.objects.count() == 0  # nor a blob key for bytes that were never (fully) written
    assert _files(root) == []  # the half-written file is gone too


@pytest.mark.xfail(
    strict=True,
    reason="cartridges/storage.py blob_write lets the storage's OSError escape: the compile endpoint answers a bare "
    "500 (HTML) instead of a JSON error saying blob storage is unavailable",
)
def test_the_api_says_blob_storage_is_unavailable(settings, tmp_path, alice, scope_a, api_client_for, fake_row, eager_tasks):
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    _storage(settings, f"{__name__}.DiskFullStorage", tmp_path / "full-disk")
    client = api_client_for(alice)
    client.raise_request_exception = False
    response = client.post("/api/scopes/scope-a/cartridges/compile/", data={}, format="json")
    assert CartridgeVersion.objects.count() == 0
    assert response.status_code == 503, response.status_code
    assert "storage" in response.json()["message"]


def _truncate(version) -> None:
    path = blob_storage().path(version.storage_name)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])


def _empty(version) -> None:
    open(blob_storage().path(version.storage_name), "wb").close()


def _remove(version) -> None:
    blob_storage().delete(version.storage_name)


DAMAGE = {"truncated": _truncate, "emptied": _empty, "removed": _remove}


@pytest.fixture
def serving(scope_a, fake_row):
    """Scope A with version 1 active, and version 2 compiled at a later head (not yet activated)."""
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    v1 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v1)
    memory_append(scope=scope_a, content="The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    return v1, v2


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_blob_is_refused_at_activation_with_a_record(serving, scope_a, damage):
    v1, v2 = serving
    DAMAGE[damage](v2)
    with pytest.raises(GateFailed) as exc:
        cartridge_activate(version=v2)
    reasons = exc.value.extra["reasons"]
    expected = "missing from storage" if damage == "removed" else "does not match its recorded sha256"
    assert any(expected in r for r in reasons), reasons
    record = CartridgeEvaluation.objects.filter(version=v2).latest("id")
    assert not record.passed and record.reasons == reasons  # the refusal is on record
    assert active_version(scope=scope_a) == v1  # the old version keeps serving
    assert cartridge_answer(scope=scope_a, question="Where is the spare key?").version_id == v1.pk


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_blob_is_refused_at_load(serving, scope_a, damage):
    from cartridges import engine

    v1, _ = serving
    engine.cache_clear()  # a cold process: the next answer loads the blob from storage
    DAMAGE[damage](v1)
    with pytest.raises(BlobUnavailable if damage == "removed" else BlobTampered) as exc:
        cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert exc.value.status_code == 409 and exc.value.extra["version"] == v1.pk


@pytest.mark.xfail(
    strict=True,
    reason="cartridges/engine.py cartridge_load (blob_read) refuses a damaged blob at load but records nothing: "
    "no log record and no row names the version, so operators only learn of it from client errors",
)
def test_a_refusal_at_load_leaves_a_record(serving, scope_a, log_of_cartridges):
    from cartridges import engine

    v1, _ = serving
    engine.cache_clear()
    _truncate(v1)
    with pytest.raises(BlobTampered):
        cartridge_answer(scope=scope_a, question="Where is the spare key?")
    warnings = [r for r in log_of_cartridges.records if r.levelno >= logging.WARNING and str(v1.pk) in r.getMessage()]
    assert warnings, [r.getMessage() for r in log_of_cartridges.records]
