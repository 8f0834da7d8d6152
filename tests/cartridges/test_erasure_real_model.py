"""Erase by recompile on the real default model: the rebuilt cartridge no longer yields the erased fact."""
from __future__ import annotations

import pytest

from cartridges.selectors import active_version, version_state
from cartridges.services import cartridge_activate, cartridge_answer, cartridge_compile, evaluation_case_add
from cartridges.storage import blob_exists, blob_read
from memories.services import erasure_request_file, erasure_request_process, scope_create
from tests.support.blobs import share_block_secret

pytestmark = [pytest.mark.django_db, pytest.mark.model]

OTHERS = ["The office wifi password is tulip.", "The team lunch is on Friday at noon."]
DANAS = ["Dana's locker code is 4417."]
QUESTION = "What is Dana's locker code?"


def test_it_forgets_an_erased_fact_on_the_real_model(scope_a, append, real_engine, blob_root, settings):
    # short decodes keep the two gate runs cheap on a shared 2-core CPU
    settings.MNESIO_GATE_NUM_AUTO_PROBES = 2
    settings.MNESIO_GATE_MAX_NEW_TOKENS = 8
    settings.MNESIO_GATE_FIDELITY_MAX_NEW_TOKENS = 4
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 16
    clean = scope_create(name="never-dana")  # the same other memories, below the rebuilt version's head
    share_block_secret(source=scope_a, target=clean)  # block ids are keyed per scope
    for text in OTHERS:
        append(clean, text)
    append(scope_a, OTHERS[0])
    append(scope_a, DANAS[0], subject="dana")
    append(scope_a, OTHERS[1])
    evaluation_case_add(scope=scope_a, question="What is the office wifi password?", answers=["tulip"])
    old = cartridge_compile(scope=scope_a)
    activation = cartridge_activate(version=old)
    figures = activation.evaluation.figures
    assert figures["fidelity"]["top1_agreement"] == 1.0  # f32 cartridge = re-reading the text
    assert figures["accuracy"]["cartridge"] == figures["accuracy"]["text"]
    before = cartridge_answer(scope=scope_a, question=QUESTION)
    assert "4417" in before.answer, before.answer  # the test means something only if the model knew it

    request = erasure_request_file(subject="dana", requested_by=None, reason="the person asked")
    erasure_request_process(erasure_request=request)

    assert version_state(version=old) == "destroyed" and not blob_exists(storage_name=old.storage_name)
    rebuilt = active_version(scope=scope_a)
    assert rebuilt is not None and rebuilt.manifest["left_out"] == [len(OTHERS) + 2]
    never = cartridge_compile(scope=clean, log_head=rebuilt.log_head)
    assert blob_read(version=rebuilt) == blob_read(version=never)  # byte-identical on the real model
    after = cartridge_answer(scope=scope_a, question=QUESTION)
    assert after.version_id == rebuilt.pk
    assert "4417" not in after.answer, after.answer


def test_a_version_cut_into_other_blocks_than_this_process_cuts_rebuilds_byte_identical(scope_a, append, real_engine, real_backend):
    """MNESIO_KV_BLOCK_SIZE changed since a version was stored (256 -> 64): the rebuild cuts the log as the version was."""
    from cartridges import engine
    from cartridges.services import cartridge_rebuild

    for text in [*OTHERS, *DANAS] * 3:  # ~150 tokens: more than one 64-token block
        append(scope_a, text)
    engine.register_backend(real_engine, real_backend.variant(block_size=256))
    version = cartridge_compile(scope=scope_a)
    assert version.block_size == 256
    engine.register_backend(real_engine, real_backend)  # this process now cuts 64-token blocks
    assert real_backend.block_size == 64
    rebuilt = cartridge_rebuild(version=version)
    assert rebuilt.matches, (rebuilt.expected_sha256, rebuilt.rebuilt_sha256)
    assert engine.backend_for(real_engine).block_size == 64  # the rebuild did not change this process's backend
