"""Storage faults: blob storage unwritable during a compile (a clear failure, no version row pointing at
nothing, no stray bytes); a blob truncated, emptied or removed on disk (refused at activation and at load,
with a record). Byte flips and swapped blobs are covered in tests/cartridges/test_gate.py."""
from __future__ import annotations

import errno
import logging

import pytest
from django.core.files.storage import FileSystemStorage

from cartridges.models import BlobKey, CartridgeEvaluation, CartridgeVersion
from cartridges.selectors import active_version
from cartridges.services import GateFailed, cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.storage import BlobStorageUnavailable, BlobTampered, BlobUnavailable, blob_storage
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
    with pytest.raises(BlobStorageUnavailable) as exc:
        cartridge_compile(scope=scope_a)
    assert exc.value.status_code == 503 and exc.value.message.startswith("blob storage unavailable: ")
    # the failure says what the storage said
    assert exc.value.extra["errno"] in ("ENOTDIR", "ENOSPC") and exc.value.__cause__.errno in (errno.ENOTDIR, errno.ENOSPC)
    assert CartridgeVersion.objects.count() == 0  # no version row pointing at nothing
    assert BlobKey.objects.count() == 0  # nor a blob key for bytes that were never (fully) written
    assert _files(root) == []  # the half-written file is gone too


def _compile_on_full_disk(settings, tmp_path, alice, scope_a, api_client_for):
    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    _storage(settings, f"{__name__}.DiskFullStorage", tmp_path / "full-disk")
    client = api_client_for(alice)
    client.raise_request_exception = False
    return client.post("/api/v1/scopes/scope-a/cartridges/compile/", data={}, format="json")


def test_the_api_says_blob_storage_is_unavailable(settings, tmp_path, alice, scope_a, api_client_for, fake_row, eager_tasks):
    response = _compile_on_full_disk(settings, tmp_path, alice, scope_a, api_client_for)
    assert CartridgeVersion.objects.count() == 0 and BlobKey.objects.count() == 0
    assert response["Content-Type"].startswith("application/json"), response.content[:300]  # not Django's HTML 500
    assert response.json()["message"].startswith("blob storage unavailable: No space left on device")
    assert response.json()["extra"]["kind"] == "BlobStorageUnavailable"


def test_the_api_answers_an_unavailable_blob_storage_with_a_503(settings, tmp_path, alice, scope_a, api_client_for, fake_row, eager_tasks):
    response = _compile_on_full_disk(settings, tmp_path, alice, scope_a, api_client_for)
    assert response.status_code == 503, response.status_code


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
def test_a_damaged_blob_is_refused_at_load(serving, scope_a, damage, settings):
    settings.MNESIO_FRESH_MAX_MEMORIES = 0  # the version answers alone (a fresh answer would not read its blob)
    from cartridges import engine

    v1, _ = serving
    engine.cache_clear()  # a cold process: the next answer loads the blob from storage
    DAMAGE[damage](v1)
    with pytest.raises(BlobUnavailable if damage == "removed" else BlobTampered) as exc:
        cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert exc.value.status_code == 409 and exc.value.extra["version"] == v1.pk


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_refusal_at_load_leaves_a_record(serving, scope_a, log_of_cartridges, damage, settings):
    settings.MNESIO_FRESH_MAX_MEMORIES = 0  # the version answers alone (a fresh answer would not read its blob)
    from cartridges import engine
    from cartridges.selectors import version_history

    v1, _ = serving
    engine.cache_clear()
    DAMAGE[damage](v1)
    before = CartridgeEvaluation.objects.filter(version=v1).count()
    for _ in range(3):  # a refused version stays active: every request is refused again, with one record
        with pytest.raises(BlobUnavailable if damage == "removed" else BlobTampered) as exc:
            cartridge_answer(scope=scope_a, question="Where is the spare key?")
    warnings = [r for r in log_of_cartridges.records if r.levelno >= logging.WARNING and f"version={v1.pk}" in r.getMessage()]
    assert len(warnings) == 3, [r.getMessage() for r in log_of_cartridges.records]
    assert "spare key" not in " ".join(r.getMessage() for r in log_of_cartridges.records)  # no plaintext
    # the record: a failed evaluation at stage "load" with the refusal's reason (immutable, like every evaluation)
    assert CartridgeEvaluation.objects.filter(version=v1).count() == before + 1
    record = CartridgeEvaluation.objects.filter(version=v1).latest("id")
    assert not record.passed and record.reasons == [exc.value.message]
    assert record.figures["stage"] == "load" and record.figures["check"]
    assert record.config_key == "fake:fake-model:f32:none"
    assert any(e["event"] == "evaluated" and e["evaluation"] == record.pk and not e["passed"] for e in version_history(version=v1))
