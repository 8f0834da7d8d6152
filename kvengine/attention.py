"""The attention kernel kvengine loads models with: transformers' sdpa, with GQA packed for multi-token queries.

transformers' sdpa integration handles grouped-query attention (fewer key/value heads than query heads) in
three ways: sdpa's own ``enable_gqa`` when there is no mask (a prefill from scratch, and single-token
decoding on the CPU), packing the query heads onto the key/value heads for a single query token under a
mask, and otherwise ``repeat_kv``, which copies
every layer's keys and values ``num_key_value_groups`` times per call. The otherwise case is exactly a
cartridge question: a few suffix tokens on top of thousands of cached positions, with a causal mask. At
8k cached tokens on SmolLM2-135M (3 key/value heads for 9 query heads) those copies were a third of the
question's time to first token.

``packed_gqa_sdpa`` packs the query heads there too: queries ``[b, kv_heads * groups, q, d]`` become
``[b, kv_heads, groups * q, d]`` (rows ordered group-major) and the mask's rows are repeated to match, so
sdpa reads each key/value head once. Every output row is computed from the same query row, keys, values and mask row as before, by the same
kernel; only the kernel's blocking of the rows changes, so results agree with the repeat_kv path to float
rounding (at most a few 1e-7 on unit-scale inputs; bitwise equal for many shapes, tests/kvengine/
test_attention.py). The cartridge and re-reading paths never ran bitwise-identical kernels anyway (a
prefill from scratch takes sdpa's causal path without a mask); their token-for-token parity is what the
real-model tests and kveval check.

Single-token decoding is packed too (``q_len == 1``, with or without a mask): transformers sends it to sdpa's
``enable_gqa`` when there is no mask, and on this CPU (torch 2.13) that path's bf16 kernel is 3-7x slower
than f32 (profiled at 8k cached tokens: ``_scaled_dot_product_flash_attention_for_cpu`` 22.5 ms per layer
in bf16 against 6.6 ms in f32, 84% of a bf16 decode step), while the same kernel on packed queries
``[1, kv_heads, groups, d]`` runs bf16 as fast as f32. That made bf16 decoding at 8k 2x slower than f32.
A prefill from scratch (no mask, many tokens) still goes to transformers: it needs sdpa's causal path.

Mixed dtypes (bf16r, precision.py): queries and keys come out of an f32 rope, values out of a bf16 matmul,
and the cache may hold bf16 keys; the query and keys are cast to the values' dtype, so attention runs in
the KV dtype (bf16) and the stored KV stays bf16.
Everything else is delegated to transformers' sdpa unchanged.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "mnesio_sdpa"


def packs(module: torch.nn.Module, query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether this call is a GQA query under a shared boolean mask (the repeat_kv case) or one unmasked token."""
    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None:
        shared_mask = query.shape[2] == 1  # one token on top of a cache sees every position: no mask needed
    else:
        shared_mask = attention_mask.dtype == torch.bool and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
    return (
        groups > 1
        and shared_mask
        and not dropout
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    )


def packed_gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with GQA queries packed instead of repeat_kv or enable_gqa (module docstring).

    A pass run by kvengine.batching carries ``mnesio_cascade``: its attention is the batcher's cascade attention.
    """
    if query.dtype != value.dtype or key.dtype != value.dtype:  # bf16r: attention in the KV dtype
        query, key = query.to(value.dtype), key.to(value.dtype)
    cascade = kwargs.pop("mnesio_cascade", None)
    if cascade is not None:
        return cascade.attend(module, query, key, value, scaling), None
    if not packs(module, query, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    groups = module.num_key_value_groups
    batch, heads, q_len, dim = query.shape  # heads = kv_heads * groups, query head h uses kv head h // groups
    packed = query.reshape(batch, heads // groups, groups * q_len, dim)  # row r * q_len + i: group r, token i
    mask = None
    if attention_mask is not None:
        mask = attention_mask.expand(attention_mask.shape[0], 1, q_len, key.shape[2]).repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(out.shape[0], heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()  # [b, q, heads, d]
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, packed_gqa_sdpa)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
