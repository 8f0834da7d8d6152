"""Forgetting one memory and deleting a scope rebuild the cartridges through the erasure path.

Rebuilt == never-had-it: the rebuilt blob equals one compiled from a log that never held the forgotten
memory (the same other memories in another scope, at the same head), as for a subject's erasure.
"""
from __future__ import annotations

import pytest

from cartridges.models import BlobKey, CartridgeDestruction, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile
from cartridges.services import compile as compile_module
from cartridges.storage import blob_exists, blob_read
from memories.models import ErasureStatus
from memories.selectors import erasure_request_status, scope_head, scope_memories_open
from memories.services import (
    erasure_request_process,
    memories_append_batch,
    memory_forget_file,
    scope_create,
    scope_delete_file,
)
from tests.support.blobs import share_block_secret

pytestmark = pytest.mark.django_db

OTHERS = ["The spare key is under the blue flowerpot.", "The car is parked on level 3.", "The cat is called Miso."]
SECRET = "The vault code is 4417."


def _log_with_secret(scope):
    """OTHERS with SECRET in the middle (seq of SECRET returned), in one batch."""
    outcomes = memories_append_batch(scope=scope, items=[
        {"content": OTHERS[0]}, {"content": SECRET, "metadata": {"kind": "secret"}},
        {"content": OTHERS[1], "subject": "dana"}, {"content": OTHERS[2]},
    ])
    return outcomes[1].memory.seq


def _forget(scope, seq):
    request = memory_forget_file(scope=scope, seq=seq, requested_by=None, reason="the user asked")
    return erasure_request_process(erasure_request=request)


def test_forgetting_a_memory_destroys_and_rebuilds_every_cartridge_holding_it(scope_a, fake_engine, blob_root):
    clean = scope_create(name="never-had-it")
    share_block_secret(source=scope_a, target=clean)  # block ids are keyed per scope
    memories_append_batch(scope=clean, items=[{"content": OTHERS[0]}, {"content": OTHERS[1], "subject": "dana"},
                                              {"content": OTHERS[2]}])
    seq = _log_with_secret(scope_a)
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    assert SECRET.encode() in blob_read(version=old)  # the fake engine stores the texts it compiled

    request = _forget(scope_a, seq)

    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert version_state(version=old) == "destroyed" and not blob_exists(storage_name=old.storage_name)
    assert not BlobKey.objects.filter(storage_name=old.storage_name).exists()
    assert CartridgeDestruction.objects.get(version=old).erasure_request_id == request.pk
    rebuilt = active_version(scope=scope_a)
    assert rebuilt is not None and rebuilt.pk != old.pk and rebuilt.log_head == scope_head(scope=scope_a)
    assert rebuilt.manifest["left_out"] == [seq]
    never = cartridge_compile(scope=clean, log_head=rebuilt.log_head)
    assert blob_read(version=rebuilt) == blob_read(version=never) and rebuilt.sha256 == never.sha256
    assert SECRET.encode() not in blob_read(version=rebuilt)
    # reads never return it again: not the text, not its metadata
    opened = {m.seq: m for m in scope_memories_open(scope=scope_a)}
    assert opened[seq].erased and opened[seq].text is None and opened[seq].metadata == {}
    assert "4417" not in cartridge_answer(scope=scope_a, question="What is the vault code?").answer


def test_forgetting_twice_rebuilds_once(scope_a, fake_engine):
    seq = _log_with_secret(scope_a)
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    first = _forget(scope_a, seq)
    rebuilt = active_version(scope=scope_a)
    second = _forget(scope_a, seq)
    assert second.pk == first.pk and active_version(scope=scope_a) == rebuilt
    assert CartridgeVersion.objects.count() == 2 and CartridgeDestruction.objects.count() == 1


def test_forgetting_a_memory_while_a_compile_runs_keeps_it_out_of_the_stored_version(
    scope_a, fake_engine, blob_root, monkeypatch
):
    seq = _log_with_secret(scope_a)
    real_compile_parts = compile_module.compile_parts
    calls = []

    def forget_while_the_model_runs(*, backend, data, scope=None):
        calls.append([entry[0] for entry in data.manifest["entries"]])
        if len(calls) == 1:  # the first attempt read the log before the forget: the store must refuse it
            _forget(scope_a, seq)
        return real_compile_parts(backend=backend, data=data, scope=scope)

    monkeypatch.setattr(compile_module, "compile_parts", forget_while_the_model_runs)
    version = cartridge_compile(scope=scope_a)
    assert seq in calls[0] and seq not in calls[1]  # read again after losing the race
    assert seq not in [entry[0] for entry in version.manifest["entries"]]
    assert SECRET.encode() not in blob_read(version=version)
    live = CartridgeVersion.objects.filter(destruction__isnull=True)
    assert all(seq not in [e[0] for e in v.manifest["entries"]] for v in live)


def test_deleting_a_scope_destroys_all_its_cartridges_and_rebuilds_none(scope_a, scope_c, fake_engine, blob_root):
    _log_with_secret(scope_a)
    partial = cartridge_compile(scope=scope_a, log_head=2)
    serving = cartridge_compile(scope=scope_a)
    cartridge_activate(version=serving)
    memories_append_batch(scope=scope_c, items=[{"content": "C's own fact."}])
    other = cartridge_compile(scope=scope_c)
    cartridge_activate(version=other)

    request = scope_delete_file(scope=scope_a, requested_by=None, reason="retired")
    erasure_request_process(erasure_request=request)

    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    for version in (partial, serving):
        assert version_state(version=version) == "destroyed" and not blob_exists(storage_name=version.storage_name)
    assert CartridgeVersion.objects.filter(scope=scope_a).count() == 2  # nothing rebuilt
    assert active_version(scope=scope_c) == other and blob_exists(storage_name=other.storage_name)
    assert {str(p.relative_to(blob_root)) for p in blob_root.rglob("*.kvc")} == {other.storage_name}


def test_a_version_listing_a_forgotten_memory_never_serves_even_before_its_rebuild(scope_a, fake_engine):
    from cartridges.selectors import version_erased_subjects

    seq = _log_with_secret(scope_a)
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    memory_forget_file(scope=scope_a, seq=seq, requested_by=None)  # shredded; the rebuild has not run yet
    assert version_erased_subjects(version=version) == [f"memory #{seq}"]
    assert active_version(scope=scope_a) is None
    assert version_state(version=version) != "active"
