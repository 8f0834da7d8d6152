"""The packed-GQA attention kernel (kvengine/attention.py) is transformers' sdpa, to float rounding, without repeat_kv."""
from __future__ import annotations

import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from kvengine.attention import ATTN_IMPLEMENTATION, packed_gqa_sdpa, packs


def _gqa_call(q_len: int, past: int, *, kv_heads: int = 3, groups: int = 3, dim: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    total = past + q_len
    query = torch.randn(1, kv_heads * groups, q_len, dim, generator=g)
    key = torch.randn(1, kv_heads, total, dim, generator=g)
    value = torch.randn(1, kv_heads, total, dim, generator=g)
    # the mask transformers builds for q_len new tokens on top of `past` cached ones: causal in the new part
    mask = (torch.arange(total)[None, :] <= torch.arange(past, total)[:, None]).view(1, 1, q_len, total)
    module = types.SimpleNamespace(num_key_value_groups=groups, is_causal=True, training=False)
    return module, query, key, value, mask


@pytest.mark.parametrize(("q_len", "past"), [(2, 0), (3, 10), (11, 1000), (13, 40), (17, 700), (14, 4000)])
def test_packed_gqa_equals_transformers_repeat_kv_path_to_float_rounding(q_len, past):
    module, query, key, value, mask = _gqa_call(q_len, past)
    assert packs(module, query, mask, 0.0, {})
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.125)  # repeat_kv inside
    got, _ = packed_gqa_sdpa(module, query, key, value, mask, scaling=0.125)
    assert got.shape == expected.shape == (1, q_len, 9, 64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)  # a few ulp: the kernel blocks rows differently
    # and it is a real attention: a row changes when a key it may see changes, not when a masked one does
    key2 = key.clone()
    key2[:, :, -1] += 1.0  # only the last new token may see the last position
    got2, _ = packed_gqa_sdpa(module, query, key2, value, mask, scaling=0.125)
    assert torch.equal(got2[:, :-1], got[:, :-1]) and not torch.equal(got2[:, -1], got[:, -1])


def test_packing_leaves_every_other_call_to_transformers_sdpa(monkeypatch):
    module, query, key, value, mask = _gqa_call(5, 10)
    assert packs(module, query[:, :, :1], mask[:, :, :1], 0.0, {})  # one token: packed too (bf16 speed, module docstring)
    assert packs(module, query[:, :, :1], None, 0.0, {})  # one unmasked token on top of a cache
    assert not packs(module, query, None, 0.0, {})  # no mask, many tokens: a prefill from scratch, sdpa's causal GQA
    assert not packs(types.SimpleNamespace(num_key_value_groups=1), query, mask, 0.0, {})  # not GQA
    assert not packs(module, query, mask.float(), 0.0, {})  # additive float mask
    assert not packs(module, query, mask, 0.1, {})  # dropout
    assert not packs(module, query, mask, 0.0, {"position_bias": torch.zeros(1)})
    assert not packs(module, query, mask, 0.0, {"softcap": 30.0})
    assert not packs(module, query, mask, 0.0, {"output_attentions": True})
    import kvengine.attention as attention

    delegated = []
    real = attention.sdpa_attention_forward
    monkeypatch.setattr(attention, "sdpa_attention_forward", lambda *a, **kw: delegated.append(a[4]) or real(*a, **kw))
    packed_gqa_sdpa(module, query, key, value, None, scaling=0.125)
    assert delegated == [None]  # the unmasked call went to transformers
    packed_gqa_sdpa(module, query, key, value, mask, scaling=0.125)
    assert delegated == [None]  # the masked multi-token call did not


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_token_decoding_is_packed_and_equals_sdpa_gqa(dtype):
    """Decoding one token (no mask) is packed: the same attention as sdpa's enable_gqa path, to rounding."""
    module, query, key, value, _ = _gqa_call(1, 3000)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=0.125, enable_gqa=True).transpose(1, 2)
    got, _ = packed_gqa_sdpa(module, query, key, value, None, scaling=0.125)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), rtol=0, atol=tol)


def test_mixed_dtypes_run_attention_in_the_value_dtype():
    """bf16r: f32 queries and keys (out of an f32 rope) over bf16 values attend in bf16."""
    module, query, key, value, mask = _gqa_call(4, 50)
    got, _ = packed_gqa_sdpa(module, query, key, value.to(torch.bfloat16), mask, scaling=0.125)
    expected, _ = packed_gqa_sdpa(module, query.bfloat16(), key.bfloat16(), value.bfloat16(), mask, scaling=0.125)
    assert got.dtype == torch.bfloat16 and torch.equal(got, expected)


@pytest.mark.model
def test_a_real_cartridge_question_and_its_decoding_take_the_packed_path(real_backend, monkeypatch):
    import kvengine.attention as attention
    from kvengine import native_pass

    monkeypatch.setattr(native_pass, "ENABLED", False)  # the model's own forward (the decoder's pass in one call: test_native_pass.py)

    assert real_backend.model.config._attn_implementation == ATTN_IMPLEMENTATION
    decisions = []
    real = attention.packs
    monkeypatch.setattr(attention, "packs", lambda *a: decisions.append((a[1].shape[2], real(*a))) or decisions[-1][1])
    cartridge = real_backend.compile(["Alice lives in Lisbon.", "Bob keeps the key under the pot."])
    decisions.clear()  # the compile prefill (no mask) is not the point here
    answer = real_backend.answer_unbatched(cartridge, "Where does Alice live?", max_new_tokens=3, stop_at_eos=False)
    layers = real_backend.model.config.num_hidden_layers
    suffix = answer.num_prompt_tokens
    assert decisions[:layers] == [(suffix, True)] * layers  # the question: every layer packed
    assert decisions[layers:] and all(d == (1, True) for d in decisions[layers:])  # decoding: packed too (bf16 speed)
