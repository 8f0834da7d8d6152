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
Everything else is delegated to transformers' sdpa unchanged.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "mnesio_sdpa"


def packs(module: torch.nn.Module, query: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether this call is a multi-token GQA query under a shared boolean mask (the repeat_kv case)."""
    groups = getattr(module, "num_key_value_groups", 1)
    return (
        groups > 1
        and query.shape[2] > 1
        and attention_mask is not None
        and attention_mask.dtype == torch.bool
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
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
    """transformers' sdpa attention, with multi-token GQA queries packed instead of repeat_kv (module docstring).

    A pass run by kvengine.batching carries ``mnesio_cascade``: its attention is the batcher's cascade attention.
    """
    cascade = kwargs.pop("mnesio_cascade", None)
    if cascade is not None:
        return cascade.attend(module, query, key, value, scaling), None
    if not packs(module, query, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)
    groups = module.num_key_value_groups
    batch, heads, q_len, dim = query.shape  # heads = kv_heads * groups, query head h uses kv head h // groups
    packed = query.reshape(batch, heads // groups, groups * q_len, dim)  # row r * q_len + i: group r, token i
    mask = attention_mask.expand(attention_mask.shape[0], 1, q_len, key.shape[2]).repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(out.shape[0], heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()  # [b, q, heads, d]
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, packed_gqa_sdpa)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
