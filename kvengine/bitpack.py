"""Bit-packing of quantization codes along head_dim: the byte layout of a quantized part's "q".

8-bit codes are one a byte. From 4 bits, the low 4 bits go two codes a byte (the even channel in the low
nibble), then bits 4.. as one bit plane each; below 4 bits, a plane per bit. A plane holds channel 8j + i in
bit i of byte j. Either way a row is bits * D / 8 bytes (docs/design/quantization.md, "Packing").
"""
from __future__ import annotations

import torch


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes [..., D] of ``bits`` bits (1-8; D a multiple of 8 below 8 bits) along the last axis."""
    if bits == 8:
        return q
    if not 1 <= bits < 8:
        raise ValueError(f"`bits` has to be 1-8 but got {bits}")
    *lead, d = q.shape
    if d % 8:
        raise ValueError(f"`head_dim` has to be a multiple of 8 for {bits}-bit packing but got {d}")
    rows = []
    if bits >= 4:
        low = q & 0x0F
        rows.append(low[..., 0::2] | (low[..., 1::2] << 4))
    for bit in range(4 if bits >= 4 else 0, bits):
        plane = ((q >> bit) & 1).reshape(*lead, d // 8, 8)
        rows.append((plane << _BIT_SHIFTS.to(q.device)).sum(-1, dtype=torch.uint8))
    return torch.cat(rows, dim=-1)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Invert pack(): the uint8 codes [..., D]."""
    if bits == 8:
        return packed
    *lead, width = packed.shape
    if not 1 <= bits < 8 or width % bits:  # bits * D / 8 bytes, D a multiple of 8
        raise ValueError(f"{width} bytes is not a row of {bits}-bit codes")
    d = 8 * width // bits
    q = torch.zeros(*lead, d, dtype=torch.uint8, device=packed.device)
    offset = 0
    if bits >= 4:
        nibbles = packed[..., : d // 2]
        q[..., 0::2] = nibbles & 0x0F
        q[..., 1::2] = nibbles >> 4
        offset = d // 2
    table = _PLANE_BITS.to(packed.device)
    for bit in range(4 if bits >= 4 else 0, bits):  # each plane byte looked up as its 8 channels' bits
        plane = packed[..., offset : offset + d // 8].reshape(-1).int()
        q |= table.index_select(0, plane).reshape(*lead, d) << bit
        offset += d // 8
    return q


_BIT_SHIFTS = torch.arange(8, dtype=torch.uint8)
_PLANE_BITS = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).to(torch.uint8)  # byte -> its 8 bits
