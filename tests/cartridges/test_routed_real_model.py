"""The routed layout's Django path on the real model, with a tiny scope (short memories, 8-token answers)."""
from __future__ import annotations

import pytest

from cartridges.models import RoutedChunk
from cartridges.services import cartridge_answer
from cartridges.services.routed_chunks import routed_chunks_open
from cartridges.services.scope_settings import scope_settings_update
from memories.services import erasure_request_process, memory_append, memory_forget_file

pytestmark = pytest.mark.django_db

FACTS = ["Ada keeps the spare key under the blue flowerpot.", "Ada drinks green tea every morning.",
         "The spare bike is in Ada's garage."]
QUESTION = "Where does Ada keep the spare key?"


@pytest.fixture
def routed_scope(scope_a, real_engine, settings):
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 8
    scope_settings_update(scope=scope_a, layout="routed")
    return [memory_append(scope=scope_a, content=text) for text in FACTS]


def test_it_answers_token_for_token_as_re_reading_the_same_memories_when_every_token_is_repaired(
    scope_a, routed_scope, real_engine, real_backend, settings
):
    settings.MNESIO_ROUTED_REPAIR = "full"
    settings.MNESIO_ROUTED_CHUNK_QUANT = "none"  # the first chunk is never recomputed: stored whole it is exact
    result = cartridge_answer(scope=scope_a, question=QUESTION)
    assert result.layout == "routed" and result.memory_seqs
    chunks = routed_chunks_open(scope=scope_a, config=real_engine, seqs=result.memory_seqs)
    reference = real_backend.answer_reread([chunks[s] for s in result.memory_seqs], QUESTION, max_new_tokens=8)
    assert result.answer == reference.text.strip() or result.answer == reference.text


def test_it_stores_q8_chunks_by_default_and_forgetting_a_memory_removes_only_its_chunk(scope_a, routed_scope, real_engine):
    cartridge_answer(scope=scope_a, question=QUESTION)
    rows = {row.memory_id: (row.quant, bytes(row.sealed)) for row in RoutedChunk.objects.filter(scope=scope_a)}
    assert rows and {quant for quant, _ in rows.values()} == {"q8"}
    key = routed_scope[0]
    if key.pk not in rows:
        pytest.fail("the key's memory was not retrieved for a question about the key")
    request = memory_forget_file(scope=scope_a, seq=key.seq, requested_by=None, reason="asked")
    erasure_request_process(erasure_request=request)
    after = {row.memory_id: (row.quant, bytes(row.sealed)) for row in RoutedChunk.objects.filter(scope=scope_a)}
    assert after == {pk: value for pk, value in rows.items() if pk != key.pk}
    result = cartridge_answer(scope=scope_a, question=QUESTION)
    assert key.seq not in result.memory_seqs and "flowerpot" not in result.answer


def test_the_gate_refuses_a_routed_scope_whose_repair_is_off_when_its_chunks_diverge(scope_a, routed_scope, real_engine, settings,
                                                                                      monkeypatch):
    from cartridges.services import evaluation_case_add
    from cartridges.services import routed_gate as gate
    from cartridges.services.errors import GateFailed

    settings.MNESIO_ROUTED_CHUNK_QUANT = "none"  # the full repair is then exact up to float summation order
    settings.MNESIO_GATE_MAX_MEAN_KL = 0.001
    settings.MNESIO_GATE_MIN_TOP1_PER_POSITION = 1.0
    evaluation_case_add(scope=scope_a, question=QUESTION, answers=["blue flowerpot"])
    evaluation_case_add(scope=scope_a, question="What does Ada drink every morning?", answers=["green tea"])

    repaired = gate.routed_gate_check(scope=scope_a, config=real_engine, repair="full", max_new_tokens=8)
    assert repaired.passed and repaired.figures["num_cases"] == 2
    assert repaired.figures["divergence"]["mean_kl"] <= 0.001

    results = []  # what the refused check measured (one gate run, spied on instead of run twice)
    measure = gate.routed_gate
    monkeypatch.setattr(gate, "routed_gate", lambda **kwargs: results.append(measure(**kwargs)) or results[-1])
    with pytest.raises(GateFailed) as refused:
        gate.routed_gate_check(scope=scope_a, config=real_engine, repair="none", max_new_tokens=8)
    assert any("repair none" in reason for reason in refused.value.reasons)
    (unrepaired,) = results
    assert not unrepaired.passed and unrepaired.figures["divergence"]["mean_kl"] > 0.001, unrepaired.figures
