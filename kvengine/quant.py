"""KV quantization for stored cartridges: q8 (8-bit) and q4 (4-bit, packed two per byte).

Both are asymmetric (a float16 zero point at the group minimum and a float16 step), grouped 64 values at a
time, and grouped the way each tensor's outliers run (as in KIVI, Liu et al. 2024):

- keys: per channel, groups of ``GROUP_SIZE`` consecutive tokens (a few key channels carry large values at
  every position; per-token groups would spend the whole 8 or 4 bits' range on them). This cut the key
  error on SmolLM2 from 1.1% to 0.25% (q8) and from 13% to 4% (q4);
- values: per token, groups of ``GROUP_SIZE`` consecutive head_dim values.

The step is rounded *up* to float16 and the zero point *down*, so every value lies inside the grid and the
round-trip error is at most half a step: ``|x - x̂| <= scale / 2`` with ``zero <= min(group)`` and
``scale >= (max(group) - zero) / (2**bits - 1)``.

Sizes relative to float32 (per 64 values; scale + zero = 4 bytes): q8 = (64 + 4) / 256 = 0.266,
q4 = (32 + 4) / 256 = 0.141 (key groups along tokens round the token count up to 64 for their parameters
only, not for the codes). Values must stay below ~1e6 in magnitude (float16 range); KV states are far smaller.
Work is done in float32 whatever the cartridge dtype, and dequantized values are cast to the serving dtype.

Cartridges keep their first ``EXACT_PREFIX_TOKENS`` positions unquantized (quantize_kv / dequantize_kv).
Those are the chat template's opening tokens, the same in every cartridge, and they act as attention sinks:
every later token puts much of its attention on them, so their error reaches every answer. Measured on
SmolLM2 by feeding the f32 greedy answer back in (teacher forcing) and comparing every position's argmax,
which reproduced bench/kv_speed.py's free-running agreement exactly: keeping 4 of them exact turned q8's 2
disagreements with f32 on kv_speed's 52 probes into none, and 2 of 64 on SQuAD scopes (kveval's packing,
32-token answers) into 1. It costs 4 x 1536 bytes per layer in f32 (+0.003 of the f32 size at 1k tokens,
+0.0004 at 8k).
"""
from __future__ import annotations

import torch

EXACT_PREFIX_TOKENS = 4  # leading positions kept in the cartridge's own dtype (see the module docstring)
GROUP_SIZE = 64  # one float16 scale + zero per 64 values keeps q8 under 0.27x and q4 under 0.15x of float32
BITS = {"q8": 8, "q4": 4}
AXES = ("token", "channel")  # "token": values (groups along head_dim); "channel": keys (groups along tokens)


def group_size(head_dim: int) -> int:
    """The group length along head_dim: GROUP_SIZE when it divides head_dim, else head_dim itself."""
    if head_dim % GROUP_SIZE == 0:
        return GROUP_SIZE
    if head_dim % 2:
        raise ValueError(f"`head_dim` has to be even for q4 packing but got {head_dim}")
    return head_dim


def _f16_up(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is >= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() < v, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _f16_down(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is <= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() > v, torch.nextafter(h, torch.full_like(h, float("-inf"))), h)


def _check(quant: str, axis: str) -> int:
    if quant not in BITS:
        raise ValueError(f"`quant` has to be one of {list(BITS)} but got {quant!r}")
    if axis not in AXES:
        raise ValueError(f"`axis` has to be one of {list(AXES)} but got {axis!r}")
    return BITS[quant]


def _grouped(x: torch.Tensor, axis: str) -> torch.Tensor:
    """View ``x`` [..., T, D] as groups (..., num_groups, group) along the quantization axis."""
    *lead, t, d = x.shape
    if axis == "token":
        g = group_size(d)
        return x.reshape(*lead, t, d // g, g)  # (..., T, D/g, g)
    pad = -t % GROUP_SIZE
    xt = x.transpose(-1, -2)  # (..., D, T)
    if pad:  # repeat the last token: the group's min and max stay those of real tokens
        xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
    return xt.reshape(*lead, d, (t + pad) // GROUP_SIZE, GROUP_SIZE)  # (..., D, ceil(T/64), 64)


def _ungrouped(xg: torch.Tensor, axis: str, num_tokens: int) -> torch.Tensor:
    """Invert _grouped: (..., num_groups, group) back to [..., T, D]."""
    if axis == "token":
        return xg.reshape(*xg.shape[:-2], xg.shape[-2] * xg.shape[-1])
    xt = xg.reshape(*xg.shape[:-2], -1)[..., :num_tokens]  # (..., D, T)
    return xt.transpose(-1, -2)


def quantize(x: torch.Tensor, quant: str, *, axis: str) -> dict[str, torch.Tensor]:
    """Quantize ``x`` [..., num_tokens, head_dim] into parts "q" (codes), "scale" and "zero" (float16)."""
    bits = _check(quant, axis)
    levels = 2**bits - 1
    xg = _grouped(x.float(), axis)
    zero = _f16_down(xg.amin(-1))  # (..., num_groups)
    scale = _f16_up((xg.amax(-1) - zero.float()) / levels)
    s = scale.float().unsqueeze(-1)
    q = torch.where(s > 0, (xg - zero.float().unsqueeze(-1)) / torch.where(s > 0, s, 1.0), 0.0)
    q = _ungrouped(q.round().clamp(0, levels).to(torch.uint8), axis, x.shape[-2]).contiguous()  # [..., T, D]
    if bits == 4:
        pairs = q.reshape(*q.shape[:-1], q.shape[-1] // 2, 2)  # (..., T, D/2, 2)
        q = pairs[..., 0] | (pairs[..., 1] << 4)  # low nibble = even channel, high nibble = odd channel
    return {"q": q, "scale": scale, "zero": zero}


def codes(parts: dict[str, torch.Tensor], quant: str) -> torch.Tensor:
    """The integer codes [..., T, D] (unpacked for q4)."""
    q = parts["q"]
    if BITS[quant] == 4:
        q = torch.stack([q & 0x0F, q >> 4], dim=-1).reshape(*q.shape[:-1], 2 * q.shape[-1])
    return q


def expand(param: torch.Tensor, axis: str, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """Broadcast a per-group parameter (scale or zero) to the full tensor ``shape`` [..., T, D]."""
    *_, t, d = shape
    if axis == "token":
        return param.float().repeat_interleave(d // param.shape[-1], dim=-1)  # (..., T, D)
    return param.float().repeat_interleave(GROUP_SIZE, dim=-1)[..., :t].transpose(-1, -2)  # (..., T, D)


def dequantize(parts: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, *, axis: str) -> torch.Tensor:
    """Invert quantize(): return [..., T, head_dim] in ``dtype``."""
    _check(quant, axis)
    q = codes(parts, quant)
    x = q.float() * expand(parts["scale"], axis, q.shape) + expand(parts["zero"], axis, q.shape)
    return x.to(dtype)


def quantize_kv(x: torch.Tensor, quant: str, *, axis: str, exact: int = EXACT_PREFIX_TOKENS) -> dict[str, torch.Tensor]:
    """quantize() all but the first ``exact`` positions of ``x`` [..., T, D]; part "exact" keeps those as they are."""
    exact = min(exact, x.shape[-2])
    parts = quantize(x[..., exact:, :], quant, axis=axis)
    parts["exact"] = x[..., :exact, :].contiguous()
    return parts


def dequantize_kv(parts: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, *, axis: str) -> torch.Tensor:
    """Invert quantize_kv(): the exact positions followed by the dequantized rest, [..., T, D] in ``dtype``."""
    return torch.cat([parts["exact"].to(dtype), dequantize(parts, quant, dtype, axis=axis)], dim=-2)
