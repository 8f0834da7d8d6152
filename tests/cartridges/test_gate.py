"""The gate: only a version that passes cartridge_is_committable() serves; a failure keeps the old one serving."""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.models import CartridgeActivation, CartridgeEvaluation
from cartridges.selectors import active_version, version_history, version_state
from cartridges.services import (
    GateFailed,
    cartridge_activate,
    cartridge_answer,
    cartridge_compile,
    cartridge_destroy,
    cartridge_evaluate,
    cartridge_rollback,
    evaluation_case_add,
    kv_configuration_switch,
)
from cartridges.services.gate import answer_correct, auto_probes, bm25_top_k
from cartridges.storage import BlobTampered, blob_storage
from kvengine.fake import UNKNOWN
from tests.support.fakes import ForgetfulBackend

pytestmark = pytest.mark.django_db


def _tamper(version) -> None:
    """Flip one byte of the stored blob in place."""
    path = blob_storage().path(version.storage_name)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))


@pytest.fixture
def serving(scope_a, append, fake_engine):
    """Scope A with two memories, one evaluation case, and version 1 active."""
    append(scope_a, "The spare key is under the blue flowerpot.")
    append(scope_a, "Dana's locker code is 4417.", subject="dana")
    evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["blue flowerpot"])
    v1 = cartridge_compile(scope=scope_a)
    cartridge_activate(version=v1)
    return v1


def test_it_records_the_figures_of_a_passing_evaluation(serving):
    evaluation = CartridgeEvaluation.objects.get(version=serving)
    assert evaluation.passed and evaluation.reasons == []
    fig = evaluation.figures
    assert fig["fidelity"]["top1_agreement"] == 1.0 and fig["fidelity"]["num_probes"] == 3
    assert fig["accuracy"]["num_cases"] == 1
    assert fig["accuracy"]["cartridge"] == fig["accuracy"]["text"] == 1.0
    assert fig["accuracy"]["retrieval"] == 1.0 and fig["accuracy"]["retrieval_required"] is False
    assert "flowerpot" not in str(fig) and "spare key" not in str(fig)  # numbers only, no text
    assert version_state(version=serving) == "active"


def test_it_serves_the_old_version_when_a_new_one_fails_the_gate(serving, scope_a, append, fake_engine):
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    engine.register_backend(fake_engine, ForgetfulBackend(model="fake-model"))
    try:
        with pytest.raises(GateFailed) as exc:
            cartridge_activate(version=v2)
        reasons = exc.value.extra["reasons"]
        assert exc.value.status_code == 409
        assert any("fidelity 0.250" in r and "below the threshold 0.95" in r for r in reasons)
        assert any("task accuracy 0.000" in r and "text re-reading's 1.000" in r for r in reasons)
        evaluation = CartridgeEvaluation.objects.filter(version=v2).get()
        assert not evaluation.passed and evaluation.reasons == reasons
        assert version_state(version=v2) == "failed"
    finally:
        engine.cache_clear(backends=True)
    assert active_version(scope=scope_a) == serving
    result = cartridge_answer(scope=scope_a, question="Where is the spare key?")
    assert result.version_id == serving.pk and "flowerpot" in result.answer
    assert not CartridgeActivation.objects.filter(version=v2).exists()


def test_it_records_every_reason_of_a_failed_gate(serving, scope_a, append):
    from memories.models import Subject
    from memories.services import subject_shred

    append(scope_a, "Dana parks in bay 12.", subject="dana")
    v2 = cartridge_compile(scope=scope_a)
    _tamper(v2)
    subject_shred(subject=Subject.objects.get(external_id="dana"))
    evaluation = cartridge_evaluate(version=v2)
    assert not evaluation.passed
    assert len(evaluation.reasons) == 2
    assert "erased subject(s): ['dana']" in evaluation.reasons[0]
    assert "does not match its recorded sha256" in evaluation.reasons[1]


def test_it_refuses_a_tampered_blob_at_activation_and_at_load(serving, scope_a, append, settings):
    settings.MNESIO_FRESH_MAX_MEMORIES = 0  # the version answers alone (a fresh answer would not read its blob)
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    _tamper(v2)
    with pytest.raises(GateFailed) as exc:
        cartridge_activate(version=v2)
    assert any("does not match its recorded sha256" in r for r in exc.value.reasons)
    assert active_version(scope=scope_a) == serving
    # tampering with the serving version's blob: refused at load, never answered (a process that already holds the
    # cartridge in memory serves those bytes, not the tampered ones: start from an empty cache, as a new process would)
    engine.cache_clear()
    _tamper(serving)
    with pytest.raises(BlobTampered):
        cartridge_answer(scope=scope_a, question="Where is the spare key?")


def test_it_refuses_a_tampered_blob_that_keeps_its_digest_out_of_the_gcm_tag(serving, scope_a, append):
    """A blob swapped for another version's bytes fails authentication (bound to its storage name)."""
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    storage = blob_storage()
    other = open(storage.path(serving.storage_name), "rb").read()
    open(storage.path(v2.storage_name), "wb").write(other)
    with pytest.raises(GateFailed):
        cartridge_activate(version=v2)


def test_it_refuses_activating_a_destroyed_version(serving, scope_a, append):
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_destroy(version=v2, reason="retention policy")
    with pytest.raises(GateFailed) as exc:
        cartridge_activate(version=v2)
    assert "is destroyed (retention policy)" in exc.value.reasons[0]
    assert version_state(version=v2) == "destroyed"
    assert active_version(scope=scope_a) == serving


def test_it_refuses_activating_a_version_of_another_configuration(serving, scope_a, eager_tasks):
    kv_configuration_switch(backend="fake", model="fake-model", dtype="bf16", quant="q8", actor=None)
    with pytest.raises(GateFailed) as exc:
        cartridge_activate(version=serving)
    assert "compiled for configuration fake:fake-model:f32:none" in exc.value.reasons[0]
    assert "active configuration is fake:fake-model:bf16:q8" in exc.value.reasons[0]


def test_it_activates_idempotently_and_rolls_back_through_the_gate(serving, scope_a, append):
    assert cartridge_activate(version=serving).pk == CartridgeActivation.objects.get().pk
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    assert v2.supersedes_id == serving.pk
    cartridge_activate(version=v2)
    assert active_version(scope=scope_a) == v2 and version_state(version=serving) == "superseded"
    rollback = cartridge_rollback(scope=scope_a)
    assert rollback.kind == "rollback" and active_version(scope=scope_a) == serving
    events = [e["event"] for e in version_history(version=serving)]
    assert events == ["compiled", "evaluated", "activated", "activated"]


def test_it_re_evaluates_when_cases_change(serving, scope_a, append):
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    cartridge_evaluate(version=v2)
    evaluation_case_add(scope=scope_a, question="Where is the car parked?", answers=["level 3"])
    cartridge_activate(version=v2)
    evaluations = CartridgeEvaluation.objects.filter(version=v2).order_by("id")
    assert evaluations.count() == 2 and evaluations[1].figures["accuracy"]["num_cases"] == 2


def test_it_scores_answers_and_ranks_memories():
    assert answer_correct("It is under the blue flowerpot.", ["Blue flowerpot"])
    assert not answer_correct("The flowerpots are blue", ["blue flowerpot"])
    assert not answer_correct(UNKNOWN, ["4417"])
    texts = ["The car is parked on level 3.", "Dana's locker code is 4417.", "The cat is called Miso."]
    assert bm25_top_k(texts, "What is Dana's locker code?", 1) == ["Dana's locker code is 4417."]
    assert bm25_top_k(texts, "car level cat", 2) == [texts[0], texts[2]]
    assert len(auto_probes(texts, 2)) == 2 and len(auto_probes(texts, 10)) == 3


def test_it_requires_the_retrieval_baseline_only_when_told(serving, scope_a, append, fake_engine, settings):
    append(scope_a, "The car is parked on level 3.")
    v2 = cartridge_compile(scope=scope_a)
    engine.register_backend(fake_engine, ForgetfulBackend(model="fake-model"))
    try:
        settings.MNESIO_GATE_ACCURACY_TOLERANCE = 1.0  # forgive the loss against text re-reading ...
        settings.MNESIO_GATE_MIN_FIDELITY = 0.0
        assert cartridge_evaluate(version=v2).passed
        settings.MNESIO_GATE_REQUIRE_RETRIEVAL = True
        settings.MNESIO_GATE_ACCURACY_TOLERANCE = 0.5  # ... but not against the top-k retrieval baseline
        evaluation = cartridge_evaluate(version=v2)
    finally:
        engine.cache_clear(backends=True)
    assert not evaluation.passed
    assert evaluation.figures["accuracy"]["retrieval"] == 1.0 and evaluation.figures["accuracy"]["cartridge"] == 0.0
    assert len(evaluation.reasons) == 2
    assert "below the top-3 retrieval baseline's 1.000 minus the tolerance 0.5" in evaluation.reasons[1]
