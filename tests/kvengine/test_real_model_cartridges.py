"""The real default model (SmolLM2-135M-Instruct, f32, CPU): parity with re-reading, bytes, refusals."""
from __future__ import annotations

import dataclasses

import pytest

from kvengine import make_backend
from kvengine.errors import ContextTooLongError, CorruptCartridgeError, EmptyInputError, IncompatibleCartridgeError
from kvengine.format import read_header, write_cartridge

pytestmark = pytest.mark.model

MEMORIES = [
    "Alice Moreau lives in Lisbon and works as a baker at the corner shop on Rua Augusta.",
    "Bob Tanaka keeps the spare key to the office under the blue flower pot by the back door.",
    "The quarterly review meeting with Carol is on Friday at three in the afternoon, in room 4B.",
    "Dmitri's daughter is called Anya; she turned seven in March and loves drawing horses.",
    "The wifi password for the guest network is written on the whiteboard in the kitchen.",
    "Eva prefers her coffee black with no sugar, and she is allergic to peanuts.",
    "The company's annual retreat will take place in Porto from the 12th to the 14th of June.",
    "Farid drives a green 2009 Volvo estate and parks it in space number 17.",
]
QUESTIONS = ["Where does Alice live?", "Where is the spare key?", "When is the meeting with Carol?", "What is Eva allergic to?"]


@pytest.fixture(scope="module")
def cartridge(real_backend):
    return real_backend.compile(MEMORIES, log_head=8, labels={"scope": "test"})


def test_the_cartridge_prefix_is_exactly_the_token_prefix_of_the_text_prompt(real_backend):
    layout = real_backend.layout
    full = layout.encode(layout.full_text(MEMORIES, QUESTIONS[0]))
    prefix = layout.encode(layout.prefix_text(MEMORIES))
    suffix = layout.encode(layout.suffix_text(QUESTIONS[0]))
    assert full == prefix + suffix
    assert real_backend.count_tokens(MEMORIES) == len(prefix)
    assert "Lisbon" not in layout.suffix_text(QUESTIONS[0])  # the question path holds no memory text


@pytest.mark.parametrize("question", [
    "1999 was when?", "'s that right?", '"Quoted" question?', "¿Dónde vive Alice?", "東京はどこ?", "...and then?",
    "- a list item?", "x", "Where does Alice live?\nAnd Bob?", "(parenthesised)?", "@handle?", "Ωmega?",
])
def test_the_question_tokenizes_the_same_alone_as_after_the_cartridge_prefix(real_backend, question):
    layout = real_backend.layout
    # the cartridge holds the user-turn opener; whatever the question starts with must not merge across it
    full = layout.encode(layout.full_text(MEMORIES, layout.clean_question(question)))
    prefix = layout.encode(layout.prefix_text(MEMORIES))
    assert full == prefix + layout.encode(layout.suffix_text(layout.clean_question(question)))


def test_f32_cartridge_answers_are_token_for_token_those_of_re_reading(real_backend, cartridge):
    assert 150 < cartridge.header.num_tokens < 400
    for question in QUESTIONS[:3]:
        from_cartridge = real_backend.answer(cartridge, question, max_new_tokens=16)
        from_text = real_backend.answer_from_text(MEMORIES, question, max_new_tokens=16)
        assert from_cartridge.token_ids == from_text.token_ids, question
        assert from_cartridge.text == from_text.text and from_cartridge.token_ids
        assert from_cartridge.num_prompt_tokens < 30 < from_text.num_prompt_tokens
        if question == QUESTIONS[0]:
            assert "Lisbon" in from_cartridge.text


def test_a_streamed_answer_is_the_answer_a_token_at_a_time(real_backend, cartridge):
    for question in QUESTIONS[:2] + ["东京在哪里?"]:
        events = list(real_backend.answer_stream(cartridge, question, max_new_tokens=16))
        *deltas, final = events
        assert all(isinstance(delta, str) and delta for delta in deltas)
        assert final.token_ids == real_backend.answer(cartridge, question, max_new_tokens=16).token_ids
        assert "".join(deltas).strip() == final.text
        assert len(deltas) >= min(2, len(final.token_ids) - 1), "a delta per token, not the whole answer at once"
    stream = real_backend.answer_stream(cartridge, QUESTIONS[0], max_new_tokens=16)
    next(stream)
    stream.close()  # a client that stops reading releases the cartridge
    assert real_backend.answer(cartridge, QUESTIONS[0], max_new_tokens=16).text


def test_answering_leaves_the_cartridge_as_it_was(real_backend, cartridge):
    before = real_backend.dumps(cartridge)
    first = real_backend.answer(cartridge, QUESTIONS[1], max_new_tokens=6)
    real_backend.answer(cartridge, "Tell me a long story about dragons.", max_new_tokens=6)
    assert real_backend.answer(cartridge, QUESTIONS[1], max_new_tokens=6).token_ids == first.token_ids
    assert real_backend.dumps(cartridge) == before


def test_fidelity_reports_agreement_of_both_ways_of_asking(real_backend, cartridge):
    report = real_backend.fidelity(cartridge, MEMORIES, QUESTIONS[3:], max_new_tokens=6)
    assert report.num_probes == 1 and report.top1_agreement == 1.0 and report.answers_identical == 1.0
    assert 0.0 <= report.mean_kl <= report.max_kl < 1e-4


def test_fidelity_sees_a_cartridge_of_other_memories(real_backend):
    """The memories are re-read once for every probe; a cartridge that holds another fact disagrees with it."""
    other = [*MEMORIES[:5], "Eva prefers her tea green with honey, and she is allergic to shellfish.", *MEMORIES[6:]]
    report = real_backend.fidelity(real_backend.compile(other), MEMORIES, [QUESTIONS[3]], max_new_tokens=8)
    assert report.answers_identical == 0.0 and report.max_kl > 1e-4  # above the bound a right cartridge keeps (above)


def test_compiling_twice_gives_identical_bytes_and_a_verified_header(real_backend, cartridge):
    data = real_backend.dumps(cartridge)
    assert real_backend.dumps(real_backend.compile(MEMORIES, log_head=8, labels={"scope": "test"})) == data
    header = read_header(data)
    assert header == cartridge.header
    assert header.model_id == "smollm2-135m-instruct" and header.dtype == "f32" and header.quant == "none"
    assert '"theta":100000.0' in header.rope_config and header.num_tokens == cartridge.header.num_tokens
    loaded = real_backend.loads(data)
    assert real_backend.answer(loaded, QUESTIONS[0], max_new_tokens=6).token_ids == real_backend.answer(cartridge, QUESTIONS[0], max_new_tokens=6).token_ids


def test_it_refuses_cartridges_of_another_model_or_quant(real_backend, cartridge, tiny_model_dir):
    data = real_backend.dumps(cartridge)
    tiny = make_backend("transformers", model=tiny_model_dir("qwen2"), dtype="f32", device="cpu")
    with pytest.raises(IncompatibleCartridgeError, match="weights_fingerprint"):
        tiny.loads(data)
    with pytest.raises(IncompatibleCartridgeError, match="model_id"):
        tiny.answer(cartridge, QUESTIONS[0])
    with pytest.raises(IncompatibleCartridgeError, match="quant"):
        real_backend.variant(quant="q8").loads(data)
    with pytest.raises(IncompatibleCartridgeError, match="backend"):
        make_backend("fake").loads(data)


def test_it_refuses_corrupt_truncated_and_forged_files(real_backend, cartridge):
    data = real_backend.dumps(cartridge)
    with pytest.raises(CorruptCartridgeError, match="truncated"):
        real_backend.loads(data[:-100])
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    with pytest.raises(CorruptCartridgeError, match="sha256"):
        real_backend.loads(bytes(flipped))
    # a re-signed file whose tensors lost a layer passes the sha256 but not the shape check
    from kvengine.format import read_cartridge

    header, tensors = read_cartridge(data)
    del tensors["tail.v"]
    with pytest.raises(CorruptCartridgeError, match="lacks the tensor .v."):
        real_backend.loads(write_cartridge(dataclasses.replace(header, payload_sha256=""), tensors))


def test_it_refuses_bad_input_with_clear_errors(real_backend, cartridge):
    with pytest.raises(EmptyInputError, match="texts"):
        real_backend.compile([])
    with pytest.raises(EmptyInputError, match="texts"):
        real_backend.compile(["   ", ""])
    with pytest.raises(EmptyInputError, match="question"):
        real_backend.answer(cartridge, "  ")
    with pytest.raises(ContextTooLongError) as err:
        real_backend.compile(["the quick brown fox jumps over the lazy dog " * 1000])
    assert err.value.limit == 8192 and err.value.num_tokens > 8192
    assert "8192" in str(err.value) and str(err.value.num_tokens) in str(err.value)
    assert "fox" not in str(err.value)  # no memory text in errors


def test_q8_and_q4_cartridges_are_a_fraction_of_f32s_size(real_backend, cartridge):
    f32_size = len(real_backend.dumps(cartridge))
    q8, q4 = real_backend.variant(quant="q8"), real_backend.variant(quant="q4")
    d8, d4 = q8.dumps(q8.compile(MEMORIES)), q4.dumps(q4.compile(MEMORIES))
    # this ~190-token cartridge pays a fixed cost (the 4 exact sink positions, the headers of its 64-token block parts,
    # their short key groups) on few tokens: q8 0.330 here, still under a third of f32
    assert len(d8) / f32_size < 1 / 3 and len(d4) / f32_size <= 0.19
    # from 1k tokens on: q8 <= 0.32x (16-value groups), q4 <= 0.16x of f32 (64-value groups); each block is
    # quantized on its own (key groups never straddle a block)
    big = real_backend.compile(MEMORIES * 6)
    assert big.header.num_tokens >= 1000
    big_size = len(real_backend.dumps(big))
    ratios = len(q8.dumps(q8.compile(MEMORIES * 6))) / big_size, len(q4.dumps(q4.compile(MEMORIES * 6))) / big_size
    assert ratios[0] <= 0.32 and ratios[1] <= 0.16, ratios


def test_a_q8_cartridge_answers_like_f32_and_q8_and_q4_answer_alike_after_a_round_trip(real_backend, cartridge):
    q8, q4 = real_backend.variant(quant="q8"), real_backend.variant(quant="q4")
    c8, c4 = q8.compile(MEMORIES), q4.compile(MEMORIES)
    d8, d4 = q8.dumps(c8), q4.dumps(c4)
    assert read_header(d8).quant == "q8" and q8.dumps(q8.loads(d8)) == d8
    for question in QUESTIONS[:2]:
        assert q8.answer(c8, question, max_new_tokens=8).token_ids == real_backend.answer(cartridge, question, max_new_tokens=8).token_ids
    assert q4.answer(q4.loads(d4), QUESTIONS[0], max_new_tokens=6).token_ids == q4.answer(c4, QUESTIONS[0], max_new_tokens=6).token_ids


def test_q4_stores_smollm2s_calibrated_bits_per_head_and_refuses_forged_ones(real_backend, long_blocks):
    from kvengine.format import RawTensor
    from kvengine.payload import from_raw, part_serve
    from kvengine.quant import bit_plan

    q4 = long_blocks.variant(quant="q4")  # 256-token blocks: the ~190-token log below is one part
    num_layers, heads = real_backend.model.config.num_hidden_layers, q4.kv_shape[0]
    plan = bit_plan("q4", num_layers, heads, real_backend.describe().weights_fingerprint)
    assert all(len(set(row)) > 1 for row in (plan["k"][18], plan["k"][23]))  # calibrated per head (kvengine/q4_plans.json)
    c4 = q4.compile(MEMORIES)
    (tail,) = c4.payload.part_tensors()  # ~190 tokens: the tail is the only part
    assert from_raw(tail["k.bits"]).tolist() == [list(r) for r in plan["k"]] and from_raw(tail["v.bits"]).tolist() == [list(r) for r in plan["v"]]
    data = q4.dumps(c4)
    # a forger who moves a bit between two heads keeps the byte count: the digest refuses it, not the shapes
    flat = [b for row in plan["k"] for b in row]
    i, j = next((i, j) for i in range(len(flat)) for j in range(len(flat)) if flat[i] > flat[j])
    forged = list(flat)
    forged[i], forged[j] = forged[i] - 1, forged[j] + 1
    assert data.count(bytes(flat)) == 1
    with pytest.raises(CorruptCartridgeError):
        q4.loads(data.replace(bytes(flat), bytes(forged)))
    # bits that do not fit the stored codes are refused as corrupt, not read as other numbers
    wrong = dict(tail, **{"k.bits": RawTensor("U8", (num_layers, heads), bytes([8] * num_layers * heads))})
    with pytest.raises(CorruptCartridgeError, match="code bytes"):
        part_serve(wrong, num_layers=num_layers, num_tokens=c4.header.num_tokens, quant="q4", dtype=q4.torch_dtype, device="cpu",
                   kv_shape=q4.kv_shape)
