"""Routed answers: repaired assemblies against re-reading the same ids, repair policies, chunk bytes."""
from __future__ import annotations

import math

import pytest
import torch

from kvengine import make_backend
from kvengine.errors import ConfigError, CorruptCartridgeError, EmptyInputError
from kvengine.routed import (
    RepairPolicy,
    assemble,
    check_chunk_ids,
    chunk_dumps,
    chunk_loads,
    compile_chunk,
    rotary_of,
    shared_prefix,
)
from kvengine.routed.repair import candidates, selected

MEMORIES = [
    "[1:56 pm on 8 May, 2023] Dana: I joined the chess club at the library yesterday and it was so much fun.",
    "[1:56 pm on 8 May, 2023] Emil: Wow, that's great, Dana! I painted a mountain lake last year.",
    "[2:10 pm on 9 June, 2023] Bob: My dog Rex is three years old and loves the beach in Lisbon.",
    "[3:00 pm on 1 July, 2023] Alice: I moved to Porto for a new job as a baker.",
]
QUESTIONS = ["What is the name of Bob's dog?", "Where did Alice move?", "What did Emil paint?"]
NUM_TOKENS = 12


@pytest.fixture(scope="module")
def chunks(real_backend):
    return [real_backend.compile_chunk(text) for text in MEMORIES]


@pytest.fixture(scope="module")
def rereadings(real_backend, chunks):
    """Each question's answer from re-reading the chunks' ids: the reference of routed answers."""
    return {question: real_backend.answer_reread(chunks, question, max_new_tokens=NUM_TOKENS) for question in QUESTIONS}


def test_it_answers_token_for_token_as_the_rereading_when_every_token_is_repaired(real_backend, chunks, rereadings):
    for question, reference in rereadings.items():
        routed = real_backend.answer_routed(chunks, question, repair=RepairPolicy.full(), max_new_tokens=NUM_TOKENS)
        assert routed.token_ids == reference.token_ids and routed.text == reference.text, question
        assert routed.mode == "routed" and routed.repair == "full"
        assert routed.num_recomputed_tokens == sum(c.num_tokens for c in chunks[1:]) - chunks[-1].num_separator_tokens


def test_its_divergence_without_repair_is_measurably_worse_than_with_full_repair(real_backend, chunks, rereadings):
    none, full = [], []
    for question, reference in rereadings.items():
        none.append(real_backend.routed_divergence(chunks, question, repair=RepairPolicy.none(), max_new_tokens=NUM_TOKENS, reference=reference))
        full.append(real_backend.routed_divergence(chunks, question, repair=RepairPolicy.full(), max_new_tokens=NUM_TOKENS, reference=reference))
    mean_none = sum(k for d in none for k in d.kls) / sum(len(d.kls) for d in none)
    mean_full = sum(k for d in full for k in d.kls) / sum(len(d.kls) for d in full)
    assert mean_full < 1e-4 and all(all(d.top1) and d.identical for d in full)
    assert mean_none > 0.01 and mean_none > 100 * mean_full
    assert not all(d.identical for d in none)


def test_it_never_writes_the_stored_chunks(real_backend, chunks):
    before = [[k.clone() for k in c.keys] + [v.clone() for v in c.values] for c in chunks]
    real_backend.answer_routed(chunks, QUESTIONS[0], repair=RepairPolicy.full(), max_new_tokens=2)
    real_backend.answer_routed(chunks, QUESTIONS[0], repair=RepairPolicy.deviation(0.15), max_new_tokens=2)
    after = [[*c.keys, *c.values] for c in chunks]
    assert all(torch.equal(a, b) for old, new in zip(before, after, strict=True) for a, b in zip(old, new, strict=True))


def test_it_recomputes_the_tokens_each_policy_names(real_backend, chunks):
    assembly = assemble(shared_prefix(real_backend), chunks, rotary_of(real_backend.model), room=0)
    pool = candidates(assembly)
    assert pool[0] == assembly.spans[1][0] and pool[-1] == assembly.spans[-1][1] - 1  # never the first chunk
    assert selected(real_backend.model, assembly, RepairPolicy.none()) == []
    first = selected(real_backend.model, assembly, RepairPolicy.first(4))
    assert first == [b + i for b, _ in assembly.spans[1:] for i in range(4)]
    deviation = selected(real_backend.model, assembly, RepairPolicy.deviation(0.15))
    assert len(deviation) == math.ceil(0.15 * len(pool)) and set(deviation) <= set(pool) and deviation == sorted(deviation)


def test_its_chunk_ids_are_the_layouts_tokenization_of_the_prompt(real_backend):
    for question in QUESTIONS:
        assert check_chunk_ids(real_backend.layout, MEMORIES, question)


def test_it_stores_a_chunk_as_bytes_whole_or_in_q8(real_backend, chunks):
    chunk = chunks[2]
    whole = chunk_loads(chunk_dumps(chunk))
    assert whole.token_ids == chunk.token_ids and whole.first_position == chunk.first_position
    assert all(torch.equal(a, b) for a, b in zip((*whole.keys, *whole.values), (*chunk.keys, *chunk.values), strict=True))
    assert chunk_dumps(chunk) == chunk_dumps(whole)  # deterministic bytes
    q8 = chunk_dumps(chunk, quant="q8")
    # 34 tokens: the first 4 kept in f32 (quant.EXACT_PREFIX_TOKENS), 30 at a byte and 16-group f16 scale/zero: 0.40x
    assert len(q8) < 0.42 * len(chunk_dumps(chunk))
    back = chunk_loads(q8)
    for held, stored in zip((*back.keys, *back.values), (*chunk.keys, *chunk.values), strict=True):
        assert float((held - stored).abs().max()) <= 0.01 * float(stored.abs().max()) + 1e-6  # within a q8 step of a group
    with pytest.raises(CorruptCartridgeError):
        chunk_loads(q8[:-100])
    with pytest.raises(CorruptCartridgeError):
        chunk_loads(b"not a chunk at all")


def test_it_refuses_bad_policies_and_empty_inputs(real_backend, chunks):
    with pytest.raises(ConfigError, match="`kind`"):
        RepairPolicy("some")
    with pytest.raises(ConfigError, match="`num_tokens`"):
        RepairPolicy.first(0)
    with pytest.raises(ConfigError, match="`ratio`"):
        RepairPolicy.deviation(1.5)
    with pytest.raises(EmptyInputError):
        compile_chunk(real_backend, "   ")
    with pytest.raises(EmptyInputError):
        real_backend.answer_routed([], QUESTIONS[0])
    assert [RepairPolicy.first(8).name, RepairPolicy.deviation(0.05).name, RepairPolicy.full().name] == ["first-8", "deviation-5%", "full"]


def test_it_refuses_a_chunk_of_another_model(real_backend, chunks, tiny_model_dir):
    tiny = make_backend("transformers", model=tiny_model_dir("qwen2"), dtype="f32", device="cpu")
    with pytest.raises(ConfigError, match="compile it again"):
        tiny.answer_routed([chunks[0]], QUESTIONS[0], max_new_tokens=2)


def test_a_qwen2_model_repaired_in_full_reads_as_its_rereading(tiny_model_dir):
    tiny = make_backend("transformers", model=tiny_model_dir("qwen2"), dtype="f32", device="cpu")
    memories = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot.", "Carol meets on Friday."]
    parts = [tiny.compile_chunk(text) for text in memories]
    for question in ["Where does Alice live?", "Where is the key?"]:
        full = tiny.routed_divergence(parts, question, repair=RepairPolicy.full(), max_new_tokens=6)
        none = tiny.routed_divergence(parts, question, repair=RepairPolicy.none(), max_new_tokens=6)
        assert max(full.kls) < 1e-6 and full.identical
        assert max(none.kls) > 1000 * max(full.kls)
