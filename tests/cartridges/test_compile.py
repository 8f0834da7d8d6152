"""Compile: versions keyed and idempotent, blobs encrypted at rest, replay byte-identical, bad input refused."""
from __future__ import annotations

import hashlib

import pytest

from cartridges import engine
from cartridges.models import BlobKey, CartridgeVersion
from cartridges.services import ContextTooLong, NothingToCompile, cartridge_compile, cartridge_rebuild
from cartridges.storage import blob_read, version_parts_read
from core.errors import MnesioError
from kvengine.fake import FakeKvBackend
from kvengine.format import read_header
from tests.support.blobs import stored_files

pytestmark = pytest.mark.django_db


def test_it_compiles_a_scope_into_a_version_with_an_encrypted_blob(scope_a, append, fake_engine, blob_root):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    version = cartridge_compile(scope=scope_a)
    assert version.log_head == 2 and version.num_memories == 2
    assert version.manifest == {"entries": [[1, None], [2, "dana"]], "left_out": []}
    assert list(version.subjects.values_list("subject", flat=True)) == ["dana"]
    assert (version.backend, version.model_id, version.dtype, version.quant) == ("fake", "fake-model", "f32", "none")
    files = stored_files(blob_root)
    assert len(files) == 1
    stored = files[0].read_bytes()
    assert b"flowerpot" not in stored and b"4417" not in stored  # encrypted at rest
    assert hashlib.sha256(stored).hexdigest() == version.stored_sha256
    data = blob_read(version=version)
    assert b"flowerpot" in data  # the fake keeps its texts in the payload: decryption gives the cartridge back
    tail, blocks = version_parts_read(version=version)
    assert hashlib.sha256(tail).hexdigest() == version.sha256  # the version digest: its tail part, which lists every block
    assert len(tail) + sum(len(part) for part in blocks.values()) == version.size_bytes
    assert read_header(data).payload_sha256 == version.payload_sha256
    assert BlobKey.objects.filter(storage_name=version.storage_name).count() == 1


def test_it_returns_the_existing_version_when_compiling_twice_at_one_head(scope_a, append, fake_engine, blob_root):
    append(scope_a, "The spare key is under the blue flowerpot.")
    first = cartridge_compile(scope=scope_a)
    second = cartridge_compile(scope=scope_a, log_head=first.log_head)
    assert second.pk == first.pk
    assert CartridgeVersion.objects.count() == 1 and len(stored_files(blob_root)) == 1


def test_it_compiles_identical_bytes_twice_at_one_head(scope_a, append, fake_engine):
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    version = cartridge_compile(scope=scope_a)
    # a fresh backend instance (another process's view) recompiles the same bytes from the log alone
    engine.cache_clear(backends=True)
    rebuilt = cartridge_rebuild(version=version)
    assert rebuilt.matches and rebuilt.rebuilt_sha256 == version.sha256


def test_it_keeps_versions_at_different_heads_apart(scope_a, scope_c, append, fake_engine):
    append(scope_a, "The spare key is under the blue flowerpot.")
    v1 = cartridge_compile(scope=scope_a)
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    assert v2.pk != v1.pk and (v1.log_head, v2.log_head) == (1, 2)
    assert v2.sha256 != v1.sha256
    assert cartridge_compile(scope=scope_a, log_head=1).pk == v1.pk


def test_it_refuses_an_empty_scope(scope_a, fake_engine, blob_root):
    with pytest.raises(NothingToCompile) as exc:
        cartridge_compile(scope=scope_a)
    assert exc.value.extra["field"] == "scope" and "no memories" in exc.value.message
    assert CartridgeVersion.objects.count() == 0 and stored_files(blob_root) == []


def test_it_refuses_a_head_in_the_future(scope_a, append, fake_engine):
    append(scope_a, "The spare key is under the blue flowerpot.")
    for bad in (5, -1, "x"):
        with pytest.raises(MnesioError) as exc:
            cartridge_compile(scope=scope_a, log_head=bad)
        assert exc.value.extra["field"] == "log_head"


def test_it_refuses_a_scope_over_the_context_window_naming_limit_and_count(scope_a, append, fake_engine, blob_root):
    engine.register_backend(fake_engine, FakeKvBackend(model="fake-model", max_context_tokens=20))
    try:
        append(scope_a, "The spare key is under the blue flowerpot next to the garden shed door.")
        append(scope_a, "The car is parked on level 3 of the airport garage, row F.")
        with pytest.raises(ContextTooLong) as exc:
            cartridge_compile(scope=scope_a)
    finally:
        engine.cache_clear(backends=True)
    assert exc.value.status_code == 422
    assert exc.value.extra["limit"] == 20 and exc.value.extra["num_tokens"] > 20
    assert "20" in exc.value.message and str(exc.value.extra["num_tokens"]) in exc.value.message
    assert "split the scope" in exc.value.message
    assert CartridgeVersion.objects.count() == 0 and BlobKey.objects.count() == 0 and stored_files(blob_root) == []


def test_it_deletes_the_blob_when_the_version_row_cannot_be_written(scope_a, append, fake_engine, blob_root, monkeypatch):
    append(scope_a, "The spare key is under the blue flowerpot.")

    def broken_create(**kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(CartridgeVersion.objects, "create", broken_create)
    with pytest.raises(RuntimeError):
        cartridge_compile(scope=scope_a)
    assert stored_files(blob_root) == [] and BlobKey.objects.count() == 0


def test_it_leaves_out_erased_memories(scope_a, append, fake_engine):
    from memories.models import Subject
    from memories.services import subject_shred

    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    version = cartridge_compile(scope=scope_a)
    assert version.manifest == {"entries": [[1, None]], "left_out": [2]}
    assert b"4417" not in blob_read(version=version)
    assert not version.subjects.exists()


def test_it_keeps_one_version_when_a_concurrent_compile_loses_the_race(scope_a, append, fake_engine, blob_root, monkeypatch):
    from cartridges.services import compile as compile_module

    append(scope_a, "The spare key is under the blue flowerpot.")
    first = cartridge_compile(scope=scope_a)
    # the loser did its existence check before the winner committed: it compiles and stores its own blob,
    # then loses on the unique constraint and must return the winner's row and delete its blob
    calls = []
    real = compile_module._existing

    def existing(**kwargs):
        calls.append(kwargs)
        return None if len(calls) == 1 else real(**kwargs)

    monkeypatch.setattr(compile_module, "_existing", existing)
    second = cartridge_compile(scope=scope_a)
    assert second.pk == first.pk and len(calls) == 2
    assert CartridgeVersion.objects.count() == 1 and BlobKey.objects.count() == 1
    assert [str(p.relative_to(blob_root)) for p in stored_files(blob_root)] == [first.storage_name]


@pytest.mark.parametrize("bad_head", ["²", "1" * 5000, "12abc", 1.5])
def test_it_refuses_a_log_head_that_is_not_a_plain_integer_naming_the_field(
    scope_a, append, fake_engine, blob_root, bad_head
):
    append(scope_a, "The spare key is under the blue flowerpot.")
    with pytest.raises(MnesioError, match="`log_head` has to be an integer"):
        cartridge_compile(scope=scope_a, log_head=bad_head)
    assert not CartridgeVersion.objects.exists() and stored_files(blob_root) == []
