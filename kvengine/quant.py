"""KV quantization for stored cartridges: q8 (symmetric int8) and q4 (asymmetric 4-bit, packed two per byte).

Both quantize in groups of ``GROUP_SIZE`` consecutive values along ``head_dim`` (one group per token and
head when head_dim is 64), with float16 scales. Scales are rounded *up* to float16 (and the q4 zero point
*down*) so every value stays inside the representable range and the round-trip error is at most half a
step:

- q8: ``|x - x̂| <= scale / 2`` with ``scale >= absmax(group) / 127``;
- q4: ``|x - x̂| <= scale / 2`` with ``scale >= (max - zero) / 15`` and ``zero <= min(group)``.

Sizes relative to float32 (per 64 values): q8 = (64 + 2) / 256 = 0.258, q4 = (32 + 2 + 2) / 256 = 0.141.
Values must stay below ~8e6 in magnitude (float16 scale range); KV states are orders of magnitude smaller.
Work is done in float32 whatever the cartridge dtype, and dequantized values are cast to the serving dtype.
"""
from __future__ import annotations

import torch

GROUP_SIZE = 64  # one float16 scale per 64 values keeps q8 under 0.27x and q4 under 0.15x of float32
_INF16 = torch.tensor(float("inf"), dtype=torch.float16)


def group_size(head_dim: int) -> int:
    """The group length for ``head_dim``: GROUP_SIZE when it divides head_dim, else head_dim itself."""
    if head_dim % GROUP_SIZE == 0:
        return GROUP_SIZE
    if head_dim % 2:
        raise ValueError(f"`head_dim` has to be even for q4 packing but got {head_dim}")
    return head_dim


def _f16_up(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is >= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() < v, torch.nextafter(h, _INF16.expand_as(h)), h)


def _f16_down(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is <= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() > v, torch.nextafter(h, (-_INF16).expand_as(h)), h)


def quantize(x: torch.Tensor, quant: str) -> dict[str, torch.Tensor]:
    """Quantize ``x`` [..., head_dim] into named parts ("q", "scale" and for q4 "zero")."""
    *lead, d = x.shape
    g = group_size(d)
    xg = x.float().reshape(*lead, d // g, g)  # (..., num_groups, group)
    if quant == "q8":
        scale = _f16_up(xg.abs().amax(-1) / 127)  # (..., num_groups)
        s = scale.float().unsqueeze(-1)
        q = torch.where(s > 0, xg / torch.where(s > 0, s, 1.0), 0.0).round().clamp(-127, 127).to(torch.int8)
        return {"q": q.reshape(*lead, d), "scale": scale}
    if quant == "q4":
        zero = _f16_down(xg.amin(-1))  # (..., num_groups)
        scale = _f16_up((xg.amax(-1) - zero.float()) / 15)
        s = scale.float().unsqueeze(-1)
        q = torch.where(s > 0, (xg - zero.float().unsqueeze(-1)) / torch.where(s > 0, s, 1.0), 0.0)
        q = q.round().clamp(0, 15).to(torch.uint8).reshape(*lead, d // 2, 2)  # (..., head_dim/2, 2)
        packed = q[..., 0] | (q[..., 1] << 4)  # low nibble = even index, high nibble = odd index
        return {"q": packed, "scale": scale, "zero": zero}
    raise ValueError(f"`quant` has to be one of ['q8', 'q4'] but got {quant!r}")


def dequantize(parts: dict[str, torch.Tensor], quant: str, dtype: torch.dtype) -> torch.Tensor:
    """Invert quantize(): return [..., head_dim] in ``dtype``."""
    if quant == "q8":
        q = parts["q"]
        *lead, d = q.shape
        num_groups = parts["scale"].shape[-1]
        xg = q.float().reshape(*lead, num_groups, d // num_groups) * parts["scale"].float().unsqueeze(-1)
        return xg.reshape(*lead, d).to(dtype)
    if quant == "q4":
        packed = parts["q"]
        *lead, half = packed.shape
        d = 2 * half
        q = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*lead, d)  # (..., head_dim)
        num_groups = parts["scale"].shape[-1]
        xg = q.float().reshape(*lead, num_groups, d // num_groups)
        xg = xg * parts["scale"].float().unsqueeze(-1) + parts["zero"].float().unsqueeze(-1)
        return xg.reshape(*lead, d).to(dtype)
    raise ValueError(f"`quant` has to be one of ['q8', 'q4'] but got {quant!r}")
