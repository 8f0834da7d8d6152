"""Moving cached keys to other positions: RoPE is a rotation, so a post-RoPE key moves by a position delta.

A key cached after RoPE at position p is R(p) k. Rotations of one frequency compose additively,
R(p + d) = R(d) R(p), so the key at position p + d is R(d) applied to the cached key:

    k' = k * cos(d * theta) + rotate_half(k) * sin(d * theta)

with cos/sin taken from the model's own rotary embedding evaluated at position d (its inv_freq, its rope
type), in float32, then cast back. That holds for every rope type whose frequencies do not depend on the
sequence length (default, linear, llama3); the dynamic and long-rope kinds rescale with the length, so a
moved key would not be the key computed there, and rerotation refuses them. The attention scaling some
rope types fold into cos/sin (yarn) is divided out: it belongs to the key once, not once per move.
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError

_LENGTH_DEPENDENT = ("dynamic", "longrope")  # rope types whose frequencies change with the sequence length


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The neox-layout half rotation (transformers' llama ``rotate_half``): (x1, x2) -> (-x2, x1) on the last axis."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rotary_of(model: Any) -> Any:
    """The model's rotary embedding module (``base_model.rotary_emb``); ConfigError if its keys cannot be moved."""
    rotary = getattr(getattr(model, "base_model", model), "rotary_emb", None)
    if rotary is None:
        raise ConfigError(f"{type(model).__name__} has no rotary embedding: its cached keys cannot be moved to other positions")
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if rope_type.startswith(_LENGTH_DEPENDENT):
        raise ConfigError(f"rope type {rope_type!r} rescales with the sequence length: its cached keys cannot be moved by a delta")
    return rotary


def delta_cos_sin(rotary: Any, delta: int, head_dim: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``delta`` positions' rotation, each ``[head_dim]`` float32 (the model's own frequencies)."""
    probe = torch.zeros(1, 1, head_dim, dtype=torch.float32, device=device)  # only its dtype and device are read
    position_ids = torch.tensor([[delta]], dtype=torch.long, device=device)  # (1, 1)
    cos, sin = rotary(probe, position_ids)  # (1, 1, head_dim) each, times the attention scaling
    scaling = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
    return cos[0, 0].float() / scaling, sin[0, 0].float() / scaling


def rerotate(keys: torch.Tensor, delta: int, rotary: Any) -> torch.Tensor:
    """Post-RoPE ``keys`` ``[..., num_tokens, head_dim]`` moved by ``delta`` positions (f32 math, cast back to their dtype)."""
    if delta == 0:
        return keys
    cos, sin = delta_cos_sin(rotary, delta, keys.shape[-1], keys.device)
    k = keys.float()
    return (k * cos + rotate_half(k) * sin).to(keys.dtype)
