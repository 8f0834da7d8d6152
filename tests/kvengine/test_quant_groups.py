"""q8's groups: 16 values on both axes, dividing the block size, a smaller round-trip error than 64-value groups."""
from __future__ import annotations

import pytest
import torch

from kvengine import quant as quant_module
from kvengine.blocks import BLOCK_SIZE
from kvengine.quant import BITS, GROUPS, dequantize, quantize


def test_every_group_length_divides_the_block_size():
    assert GROUPS[("q8", "channel")] == GROUPS[("q8", "token")] == 16
    for (quant, axis), length in GROUPS.items():
        assert BLOCK_SIZE % length == 0, (quant, axis, length)


@pytest.mark.parametrize("quant", list(BITS))
def test_key_groups_never_straddle_a_block_boundary(quant):
    # keys are grouped along tokens: quantizing two blocks on their own gives the parts of quantizing both at once
    torch.manual_seed(0)
    x = torch.randn(2, 3, 2 * BLOCK_SIZE, 64) * torch.linspace(0.1, 8, 64)
    whole = quantize(x, quant, axis="channel")
    halves = [quantize(x[..., i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE, :], quant, axis="channel") for i in range(2)]
    assert torch.equal(whole["q"], torch.cat([h["q"] for h in halves], dim=-2))
    for part in ("scale", "zero"):
        assert torch.equal(whole[part], torch.cat([h[part] for h in halves], dim=-1))


def _kv_like(num_tokens: int) -> torch.Tensor:
    """Keys/values with a few outlier channels and slowly drifting magnitudes along tokens, as a model's are."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, num_tokens, 64, generator=gen)
    x[..., [3, 17, 40]] *= 12
    return x * (1 + torch.rand(1, 3, num_tokens, 1, generator=gen) * 3)


@pytest.mark.parametrize("axis", ["token", "channel"])
def test_sixteen_value_groups_cut_the_q8_round_trip_error(monkeypatch, axis):
    x = _kv_like(512)
    fine = (dequantize(quantize(x, "q8", axis=axis), "q8", torch.float32, axis=axis) - x).pow(2).mean()
    monkeypatch.setitem(GROUPS, ("q8", "channel"), 64)
    monkeypatch.setitem(GROUPS, ("q8", "token"), 64)
    coarse = (dequantize(quantize(x, "q8", axis=axis), "q8", torch.float32, axis=axis) - x).pow(2).mean()
    assert fine < 0.8 * coarse


@pytest.mark.parametrize("num_tokens", [1000, 8000])
def test_q8_stores_at_most_0_32_of_float32(num_tokens):
    # (16 codes + 2 x 2 bytes of float16 scale and zero) per 16 values = 20 / 64 bytes = 0.3125 of float32
    x = torch.randn(1, 3, num_tokens, 64)
    stored = sum(t.numel() * t.element_size() for axis in ("token", "channel") for t in quantize(x, "q8", axis=axis).values())
    assert stored / (2 * x.numel() * 4) <= 0.32
    assert quant_module.GROUP_SIZE == 16
