"""The attention kernel kvengine loads models with: transformers' sdpa, with GQA packed for multi-token queries.

``packed_gqa_sdpa`` packs the query heads onto their key/value heads (``[b, kv_heads * groups, q, d]`` ->
``[b, kv_heads, groups * q, d]``, the mask's rows repeated to match), so sdpa reads each key/value head once
instead of transformers copying them with ``repeat_kv``: a cartridge question's case (a few tokens over a
long cache, under a mask), and single-token decoding, whose unpacked bf16 CPU kernel is several times slower.
Results agree with the repeat_kv path to float rounding. Under bf16r the query and keys are cast to the
values' dtype. A single-token step, or a question's few tokens each seeing the positions up to its own (a causal
mask), goes to kvengine.fused's kernel when it takes it (it reads the KV once, fused; sdpa's flash kernel where it
is unavailable). A batched pass (``mnesio_cascade``) goes to kvengine.cascade; everything else to
transformers' sdpa unchanged.

Design and measurements: docs/design/attention.md.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from . import fused

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
    """transformers' sdpa attention, with GQA queries packed instead of repeat_kv or enable_gqa (docs/design/attention.md).

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
    if packed.shape[2] <= fused.MAX_ROWS and batch == 1 and not torch.compiler.is_compiling():
        limits = None if attention_mask is None else fused.prefix_limits(attention_mask, key.shape[2])
        if attention_mask is None or limits is not None:  # each token sees the first positions: the fused kernel
            out = fused.decode_attention(packed, key, value, dim**-0.5 if scaling is None else scaling,
                                         None if limits is None else limits.repeat(groups))
            if out is not None:
                out = out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()
                return out, None
    mask = None
    if attention_mask is not None:
        mask = attention_mask.expand(attention_mask.shape[0], 1, q_len, key.shape[2]).repeat(1, 1, groups, 1)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    out = out.reshape(out.shape[0], heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()  # [b, q, heads, d]
    return out, None


AttentionInterface.register(ATTN_IMPLEMENTATION, packed_gqa_sdpa)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
