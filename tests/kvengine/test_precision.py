"""The divergence measure (kvengine.precision) on tiny inputs, and bf16r on the real model."""
from __future__ import annotations

import math

import pytest
import torch

from kvengine.divergence import AnswerDivergence, DivergenceSummary, kl_divergence, nearest_rank
from kvengine.precision import residual_f32


def _logp(*rows):
    return torch.log(torch.tensor(rows, dtype=torch.float64))


def test_kl_of_identical_distributions_is_exactly_zero():
    logp = torch.log_softmax(torch.randn(5, 300, generator=torch.Generator().manual_seed(1)), dim=-1)
    assert kl_divergence(logp, logp.clone()).tolist() == [0.0] * 5


def test_kl_of_a_known_pair_is_the_known_value():
    p, q = _logp([0.5, 0.5]), _logp([0.25, 0.75])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.1438...
    assert kl_divergence(p, q).item() == pytest.approx(expected, rel=1e-12)
    # KL is not symmetric: the reference comes first
    assert kl_divergence(q, p).item() == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), rel=1e-12)


def test_kl_ignores_tokens_the_reference_gives_no_mass_and_refuses_mismatched_shapes():
    p = _logp([1.0, 0.0])
    q = _logp([0.5, 0.5])
    assert kl_divergence(p, q).item() == pytest.approx(math.log(2.0))
    with pytest.raises(ValueError, match="shapes differ"):
        kl_divergence(p, _logp([0.2, 0.3, 0.5]))


def test_summary_counts_positions_top1_first_token_and_identity():
    same = AnswerDivergence.of(_logp([0.9, 0.1], [0.2, 0.8]), _logp([0.9, 0.1], [0.2, 0.8]), identical=True)
    off = AnswerDivergence.of(_logp([0.6, 0.4], [0.7, 0.3]), _logp([0.4, 0.6], [0.7, 0.3]), identical=False)
    assert same.kls == [0.0, 0.0] and same.top1 == [True, True]
    assert off.top1 == [False, True] and off.kls[1] == 0.0 and off.kls[0] > 0
    s = DivergenceSummary.of([same, off])
    assert s.num_questions == 2 and s.num_positions == 4
    assert s.mean_kl == pytest.approx(off.kls[0] / 4)
    assert s.first_token_mean_kl == pytest.approx(off.kls[0] / 2)
    assert s.top1_per_position == 0.75 and s.first_token_top1 == 0.5 and s.identical == 0.5
    assert s.p95_kl == off.kls[0] and s.max_kl == off.kls[0]


def test_nearest_rank_quantile():
    assert nearest_rank(list(range(1, 21)), 0.95) == 19
    assert nearest_rank([3.0], 0.95) == 3.0 and nearest_rank([], 0.95) is None


def _tiny_llama(num_layers: int):
    """A float32 Llama of random weights (seeded), with kvengine's attention (bf16r needs it: mixed dtypes)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from kvengine.attention import ATTN_IMPLEMENTATION

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    config._attn_implementation = ATTN_IMPLEMENTATION
    return LlamaForCausalLM(config).eval()


def test_residual_f32_keeps_the_stream_in_f32_and_matmuls_in_bf16():
    model = residual_f32(_tiny_llama(2))
    config = model.config
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.dtype == torch.bfloat16 and layer.mlp.down_proj.weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.float32
    seen = {}

    def record(module, args, kwargs):
        seen["stream"] = (args[0] if args else kwargs["hidden_states"]).dtype

    model.model.layers[1].register_forward_pre_hook(record, with_kwargs=True)
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[1, 2, 3, 4]]), cache=cache, use_cache=True)
    assert seen["stream"] == torch.float32  # the hidden state between blocks
    # values come out of a bf16 matmul; keys out of the f32 rope (the payload stores both in bf16: next test)
    assert cache.layers[0].values.dtype == torch.bfloat16 and cache.layers[0].keys.dtype == torch.float32
    assert out.logits.dtype == torch.float32
    with pytest.raises(ValueError, match="float32"):
        residual_f32(_tiny_llama(1).to(torch.bfloat16))


@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 13, 576), (2, 300, 96)])
def test_bf16_linear_with_f32_output_is_the_accumulator_not_its_bf16_rounding(shape):
    """bf16r's exact outputs: the product of the bf16 inputs to ~2^-16 of its size, where a bf16 output is off by ~2^-9."""
    from kvengine.precision import bf16_linear_f32_out

    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g).to(torch.bfloat16)
    w = torch.randn(160, shape[-1], generator=g).to(torch.bfloat16)
    bias = torch.randn(160, generator=g).to(torch.bfloat16)
    for b in (None, bias):
        exact = x.double() @ w.double().T + (0 if b is None else b.double())
        out = bf16_linear_f32_out(x, w, b)
        assert out.dtype == torch.float32 and out.shape == (*shape[:-1], 160)
        rounded = torch.nn.functional.linear(x, w, b).double()
        scale = exact.abs().amax().item()
        assert (out.double() - exact).abs().amax().item() < 2**-15 * scale
        assert (rounded - exact).abs().amax().item() > 2**-11 * scale  # what it replaces: bf16 output rounding
        assert torch.equal(bf16_linear_f32_out(x, w, b), out)  # deterministic


def test_bf16_linear_with_f32_output_falls_back_to_an_f32_matmul_where_onednn_has_no_bf16(monkeypatch):
    import kvengine.precision as precision

    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(1, 7, 64, generator=g).to(torch.bfloat16), torch.randn(48, 64, generator=g).to(torch.bfloat16)
    fast = precision.bf16_linear_f32_out(x, w)
    monkeypatch.setattr(precision, "_onednn_bf16", lambda: False)
    slow = precision.bf16_linear_f32_out(x, w)
    assert torch.equal(slow, x.float() @ w.float().T)
    assert (fast - slow).abs().amax() < 2**-15 * slow.abs().amax()


def test_residual_f32_gives_exact_outputs_to_every_linear_but_v_proj_and_the_head():
    model = residual_f32(_tiny_llama(1))
    x = torch.randn(1, 5, 32)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    for module in (attn.q_proj, attn.k_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj):
        out = module(x)
        exact = x.to(torch.bfloat16).double() @ module.weight.double().T
        assert out.dtype == torch.float32 and (out.double() - exact).abs().amax() < 1e-4 * exact.abs().amax()
        assert not torch.equal(out, out.to(torch.bfloat16).float())  # not a bf16 value cast up
    assert attn.v_proj(x).dtype == torch.bfloat16  # the KV's own dtype: one rounding either way
    h = torch.randn(1, 5, 64)
    down, exact = mlp.down_proj(h), h.to(torch.bfloat16).double() @ mlp.down_proj.weight.double().T
    assert down.dtype == torch.float32 and (down.double() - exact).abs().amax() < 1e-4 * exact.abs().amax()
    # a deep copy (how the backend makes variants) computes with its own weights, not the original's
    import copy

    other = copy.deepcopy(model)
    other.model.layers[0].self_attn.q_proj.weight.data.zero_()
    assert other.model.layers[0].self_attn.q_proj(x).abs().amax() == 0 and attn.q_proj(x).abs().amax() > 0


@pytest.mark.model
def test_teacher_forcing_feeds_the_reference_tokens(real_backend):
    """Row i of answer_logprobs is the distribution after the question and reference tokens 0..i-1."""
    memories = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot."]
    question = "Where does Alice live?"
    cartridge = real_backend.compile(memories)
    answer = real_backend.answer(cartridge, question, max_new_tokens=8, stop_at_eos=False)
    logp = real_backend.answer_logprobs(cartridge, question, answer.token_ids)
    assert logp.shape == (len(answer.token_ids) + 1, real_backend.model.config.vocab_size)
    # greedy decoding picked the argmax at each position of its own answer: teacher forcing sees the same
    assert logp[:-1].argmax(-1).tolist() == list(answer.token_ids)
    # forcing other tokens changes the later rows, not the first
    forced = [answer.token_ids[0], 30, 31, 32]
    other = real_backend.answer_logprobs(cartridge, question, forced)
    assert torch.allclose(other[0], logp[0], atol=1e-4)
    assert kl_divergence(logp[2], other[2]).item() > 1e-3
    assert kl_divergence(logp, logp).abs().max().item() == 0.0
    # the cartridge's scratch tail was given back: answering again gives the same tokens
    assert real_backend.answer(cartridge, question, max_new_tokens=8, stop_at_eos=False).token_ids == answer.token_ids


@pytest.mark.model
def test_a_bf16r_cartridge_is_a_bf16_cartridge_under_its_own_key_and_close_to_f32(real_backend):
    from kvengine import IncompatibleCartridgeError

    memories = ["Alice lives in Lisbon and works as a baker.", "Bob keeps the spare key under the blue flower pot."]
    question = "Where does Alice live?"
    bf16r, bf16 = real_backend.variant(dtype="bf16r"), real_backend.variant(dtype="bf16")
    cartridge = bf16r.compile(memories)
    assert cartridge.header.dtype == "bf16r" and bf16r.describe().config.key.endswith(":bf16r:none")
    assert all(k.dtype == torch.bfloat16 for k in cartridge.payload.state.keys + cartridge.payload.state.values)
    data = bf16r.dumps(cartridge)
    assert len(data) < 0.55 * len(real_backend.dumps(real_backend.compile(memories)))
    assert bf16r.dumps(bf16r.loads(data)) == data and bf16r.dumps(bf16r.compile(memories)) == data  # deterministic
    with pytest.raises(IncompatibleCartridgeError):
        bf16.loads(data)  # same bytes per value, another arithmetic: another compatibility key
    reference = real_backend.compile(memories)
    ids = real_backend.answer(reference, question, max_new_tokens=8).token_ids
    ref = real_backend.answer_logprobs(reference, question, ids)
    kl_r = kl_divergence(ref, bf16r.answer_logprobs(cartridge, question, ids)).mean().item()
    kl_b = kl_divergence(ref, bf16.answer_logprobs(bf16.compile(memories), question, ids)).mean().item()
    assert kl_r < kl_b  # one short answer: the direction only; kveval measures the size of the gap
