"""Erase by recompile: every cartridge holding the subject is destroyed, the scope rebuilt without it."""
from __future__ import annotations

import pytest

from cartridges.models import BlobKey, CartridgeDestruction, CartridgeVersion
from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, cartridge_views_rebuild
from cartridges.storage import blob_exists, blob_read
from core.errors import MnesioError
from memories.models import ErasureStatus
from memories.registry import view_rebuilders
from memories.selectors import erasure_request_status, log_head, scope_head
from memories.services import erasure_request_file, erasure_request_process, scope_create
from tests.support.blobs import share_block_secret

pytestmark = pytest.mark.django_db

OTHERS = ["The spare key is under the blue flowerpot.", "The car is parked on level 3.", "The cat is called Miso."]
DANAS = ["Dana's locker code is 4417.", "Dana parks in bay 12."]


def _log_with_dana(scope, append):
    """OTHERS interleaved with Dana's memories."""
    append(scope, OTHERS[0])
    append(scope, DANAS[0], subject="dana")
    append(scope, OTHERS[1])
    append(scope, DANAS[1], subject="dana")
    append(scope, OTHERS[2])


def _erase(subject: str):
    request = erasure_request_file(subject=subject, requested_by=None, reason="the person asked")
    return erasure_request_process(erasure_request=request)


def test_it_registers_the_rebuilder_with_the_log():
    assert cartridge_views_rebuild in view_rebuilders()


def test_it_destroys_and_rebuilds_cartridges_holding_an_erased_subject(scope_a, append, fake_engine, blob_root):
    # a log that never held Dana's memories: the same other memories in another scope, below the same head
    clean_scope = scope_create(name="never-dana")
    share_block_secret(source=scope_a, target=clean_scope)  # block ids are keyed per scope
    for text in OTHERS:
        append(clean_scope, text)
    _log_with_dana(scope_a, append)
    old_partial = cartridge_compile(scope=scope_a, log_head=5)
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)

    request = _erase("dana")

    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    for version in (old_partial, old):
        assert version_state(version=version) == "destroyed"
        assert not blob_exists(storage_name=version.storage_name)
        assert not BlobKey.objects.filter(storage_name=version.storage_name).exists()
        assert CartridgeDestruction.objects.get(version=version).erasure_request_id == request.pk
    rebuilt = active_version(scope=scope_a)
    assert rebuilt is not None and rebuilt.pk not in (old.pk, old_partial.pk)
    # compiled at the scope's own head (the global head is not a client's business), here also the log's
    assert rebuilt.log_head == scope_head(scope=scope_a) == log_head() == 8
    assert rebuilt.manifest["left_out"] == [5, 7] and not rebuilt.subjects.exists()
    never = cartridge_compile(scope=clean_scope, log_head=rebuilt.log_head)
    assert blob_read(version=rebuilt) == blob_read(version=never)
    assert rebuilt.sha256 == never.sha256
    # every file left in storage is a live version's blob
    live = {v.storage_name for v in CartridgeVersion.objects.exclude(destruction__isnull=False)}
    assert {str(p.relative_to(blob_root)) for p in blob_root.rglob("*.kvc")} == live
    answer = cartridge_answer(scope=scope_a, question="What is Dana's locker code?")
    assert answer.version_id == rebuilt.pk and "4417" not in answer.answer


def test_it_rebuilds_at_an_unchanged_head(scope_a, append, fake_engine):
    _log_with_dana(scope_a, append)
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    _erase("dana")
    rebuilt = active_version(scope=scope_a)
    assert rebuilt.log_head == old.log_head and rebuilt.manifest_digest != old.manifest_digest


def test_it_leaves_a_scope_without_cartridge_when_nothing_survives(scope_a, append, fake_engine):
    append(scope_a, DANAS[0], subject="dana")
    old = cartridge_compile(scope=scope_a)
    cartridge_activate(version=old)
    request = _erase("dana")
    assert erasure_request_status(erasure_request=request) == ErasureStatus.VIEWS_REBUILT
    assert active_version(scope=scope_a) is None and version_state(version=old) == "destroyed"


def test_it_is_safe_to_run_the_rebuild_twice(scope_a, append, fake_engine):
    _log_with_dana(scope_a, append)
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    request = _erase("dana")
    rebuilt = active_version(scope=scope_a)
    cartridge_views_rebuild(request)
    assert active_version(scope=scope_a) == rebuilt
    assert CartridgeVersion.objects.count() == 2 and CartridgeDestruction.objects.count() == 1


def test_it_refuses_a_second_erasure_of_an_erased_subject_and_loses_nothing(scope_a, append, fake_engine):
    _log_with_dana(scope_a, append)
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    _erase("dana")
    rebuilt = active_version(scope=scope_a)
    try:
        second = _erase("dana")
    except MnesioError as exc:  # the log may refuse to file it
        assert "dana" in exc.message
    else:  # or process it as a no-op
        assert erasure_request_status(erasure_request=second) == ErasureStatus.VIEWS_REBUILT
    assert active_version(scope=scope_a) == rebuilt
    assert blob_exists(storage_name=rebuilt.storage_name)
