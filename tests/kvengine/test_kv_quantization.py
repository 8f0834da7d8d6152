"""q8/q4 KV quantization: round-trip error bounds (property tests) and stored sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvengine.quant import GROUP_SIZE, dequantize, group_size, quantize

F16_TINY = 2.0**-24  # float16's smallest subnormal step: the scale rounding can add at most one


def _kv(head_dim: int):
    """Strategy: [1, heads, tokens, head_dim] float32 arrays with KV-like magnitudes."""
    shape = st.tuples(st.just(1), st.integers(1, 3), st.integers(1, 5), st.just(head_dim))
    values = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
    return shape.flatmap(lambda s: arrays(np.float32, s, elements=values))


def _groups(x: torch.Tensor) -> torch.Tensor:
    g = group_size(x.shape[-1])
    return x.reshape(*x.shape[:-1], x.shape[-1] // g, g)  # (..., num_groups, group)


@settings(max_examples=60, deadline=None)
@given(_kv(64) | _kv(16))
def test_q8_round_trip_stays_within_half_a_step(a):
    x = torch.from_numpy(a)
    parts = quantize(x, "q8")
    back = dequantize(parts, "q8", torch.float32)
    scale = parts["scale"].float()
    absmax = _groups(x).abs().amax(-1)
    assert parts["q"].dtype == torch.int8 and back.shape == x.shape
    assert torch.all(scale >= absmax / 127)
    assert torch.all(scale <= absmax / 127 * (1 + 2**-10) + F16_TINY)
    err = _groups((x - back).abs()).amax(-1)
    assert torch.all(err <= scale / 2 * (1 + 1e-6) + 1e-6 * absmax)


@settings(max_examples=60, deadline=None)
@given(_kv(64) | _kv(16))
def test_q4_round_trip_stays_within_half_a_step(a):
    x = torch.from_numpy(a)
    parts = quantize(x, "q4")
    back = dequantize(parts, "q4", torch.float32)
    xg = _groups(x)
    lo, hi = xg.amin(-1), xg.amax(-1)
    scale, zero = parts["scale"].float(), parts["zero"].float()
    assert parts["q"].dtype == torch.uint8 and parts["q"].shape[-1] == x.shape[-1] // 2
    assert torch.all(zero <= lo) and torch.all(scale * 15 >= hi - zero)
    # the float16 zero point sits at most one float16 step below the minimum
    assert torch.all(hi - zero <= (hi - lo) + lo.abs() * 2**-10 + F16_TINY)
    err = _groups((x - back).abs()).amax(-1)
    assert torch.all(err <= scale / 2 * (1 + 1e-6) + 1e-6 * (lo.abs() + hi.abs()))


def test_it_keeps_zeros_exact_and_q4_keeps_constant_groups_exact():
    x = torch.zeros(1, 2, 3, 64)
    for quant in ("q8", "q4"):
        assert torch.equal(dequantize(quantize(x, quant), quant, torch.float32), x)
    x[0, 1] = 0.5  # q4's zero point is the group minimum: a constant group needs no step at all
    assert torch.equal(dequantize(quantize(x, "q4"), "q4", torch.float32), x)


@pytest.mark.parametrize(("quant", "limit"), [("q8", 0.27), ("q4", 0.15)])
def test_stored_parts_are_a_fraction_of_float32(quant, limit):
    x = torch.randn(1, 3, 100, 64)
    stored = sum(t.numel() * t.element_size() for t in quantize(x, quant).values())
    assert stored / (x.numel() * 4) <= limit


def test_it_refuses_an_unknown_quant():
    with pytest.raises(ValueError, match="quant"):
        quantize(torch.zeros(1, 1, 1, GROUP_SIZE), "q3")
