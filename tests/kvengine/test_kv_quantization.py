"""q8/q4 KV quantization: round-trip error bounds (property tests) and stored sizes."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kvengine import quant as quant_module
from kvengine.quant import GROUP_SIZE, dequantize, expand, hadamard, quantize

F16_TINY = 2.0**-24  # float16's smallest subnormal step: rounding a parameter can add at most one


def _kv(head_dim: int):
    """Strategy: [1, heads, tokens, head_dim] float32 arrays with KV-like magnitudes (tokens cross a 64 group)."""
    shape = st.tuples(st.just(1), st.integers(1, 2), st.sampled_from([1, 5, 64, 70]), st.just(head_dim))
    # rotated by H, a value can grow sqrt(head_dim) = 8x: float16 parameters then still hold them
    values = st.floats(-5e3, 5e3, allow_nan=False, allow_infinity=False, width=32)
    return shape.flatmap(lambda s: arrays(np.float32, s, elements=values))


def _check_round_trip(a: np.ndarray, quant: str, axis: str) -> None:
    original = torch.from_numpy(a)
    parts = quantize(original, quant, axis=axis)
    back = dequantize(parts, quant, torch.float32, axis=axis)
    bits, int_zero = quant_module.AXIS_BITS[(quant, axis)], quant_module.INT_ZERO[(quant, axis)]
    assert back.shape == original.shape and parts["q"].dtype == torch.uint8
    d = original.shape[-1]
    assert parts["q"].shape[-1] == bits * d // 8  # packed (bitpack.pack)
    rot = hadamard(original.shape[-1]) if quant_module.ROTATE[(quant, axis)] else None
    # the grid bounds hold in the rotated space; H is orthonormal, so the L2 error carries over
    x = original @ rot if rot is not None else original
    if rot is not None:
        back_rot = back.double() @ rot.double()
        err, err_rot = (back.double() - original.double()).norm(), (back_rot - x.double()).norm()
        # float32 rounding of two rotations; below float32's normal range (hypothesis finds subnormal inputs) the
        # rounding is absolute, up to the smallest normal per value
        slack = (1e-5 * original.abs().amax().double() + torch.finfo(torch.float32).tiny) * original.numel() ** 0.5
        assert abs(err - err_rot) <= 1e-3 * err_rot + slack, (err, err_rot, slack)
        back = back_rot.float()
    scale, zero = expand(parts["scale"], axis, x.shape, quant), expand(parts["zero"], axis, x.shape, quant)
    levels = 2**bits - 1
    edge = 0.0
    if int_zero:  # the grid starts `zero` codes below 0 (and holds 0): its ends are within half a step of the group's
        assert parts["zero"].dtype == torch.uint8
        zero, edge = -zero * scale, scale / 2
    tol = 1e-6 * x.abs().amax() * (x.shape[-1] if rot is not None else 1)  # float32 rounding (and of the rotations)
    assert torch.all(zero - edge <= x + tol) and torch.all(x <= zero + scale * levels + edge + tol)  # inside its grid
    # and the grid is tight: one float16 rounding of the zero point and of the step at most
    assert torch.all(scale <= (x.abs().amax() * 2 + x.abs().amax() * 2**-10) / levels * (1 + 2**-10) + F16_TINY)
    assert torch.all((x - back).abs() <= scale / 2 * (1 + 1e-5) + tol)


@settings(max_examples=40, deadline=None)
@given(_kv(64) | _kv(16), st.sampled_from(["token", "channel"]))
def test_q8_round_trip_stays_within_half_a_step(a, axis):
    _check_round_trip(a, "q8", axis)


@settings(max_examples=40, deadline=None)
@given(_kv(64) | _kv(16), st.sampled_from(["token", "channel"]))
def test_q4_round_trip_stays_within_half_a_step(a, axis):
    _check_round_trip(a, "q4", axis)


def test_q8_error_is_small_against_the_group_range():
    torch.manual_seed(0)
    x = torch.randn(1, 3, 100, 64)
    h = hadamard(64)
    for axis in ("token", "channel"):
        back = dequantize(quantize(x, "q8", axis=axis), "q8", torch.float32, axis=axis)
        err = (back @ h - x @ h).abs().max()  # the grid is in the rotated space
        assert err <= ((x @ h).max() - (x @ h).min()) / 255 / 2 * 1.01


def test_it_keeps_zeros_exact_and_constant_groups_exact_or_within_half_a_step(monkeypatch):
    monkeypatch.setattr(quant_module, "ROTATE", {key: False for key in quant_module.ROTATE})  # exact in unrotated groups
    x = torch.zeros(1, 2, 3, 64)
    x[0, 1] = 0.5
    for quant in ("q8", "q4"):
        for axis in ("token", "channel"):
            back = dequantize(quantize(x, quant, axis=axis), quant, torch.float32, axis=axis)
            assert torch.equal(back[0, 0], x[0, 0])  # zeros, always
            if quant_module.INT_ZERO[(quant, axis)]:  # a grid from 0: a constant lands within half a step
                assert torch.allclose(back[0, 1], x[0, 1], rtol=0, atol=0.5 / 15 / 2 * 1.01)
            else:  # a float16 minimum: the constant is the zero point itself
                assert torch.equal(back, x)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("head_dim", [64, 16, 8])
def test_packing_round_trips_in_bits_times_head_dim_over_8_bytes_and_keeps_format_5s_nibbles(bits, head_dim):
    from kvengine.bitpack import pack, unpack

    q = torch.randint(0, 2**bits, (2, 3, 7, head_dim), dtype=torch.uint8, generator=torch.Generator().manual_seed(bits))
    packed = pack(q, bits)
    assert packed.shape == (2, 3, 7, bits * head_dim // 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack(packed, bits), q)
    assert unpack(pack(q[:, :, :0], bits), bits).shape == (2, 3, 0, head_dim)  # no tokens
    planes = 0
    if 4 <= bits < 8:  # the low 4 bits two a byte: the even channel in the low nibble
        low = q & 0x0F
        assert torch.equal(packed[..., : head_dim // 2], low[..., 0::2] | (low[..., 1::2] << 4))
        planes = head_dim // 2
    if bits < 8:  # then one plane per further bit, channel 8j + i in bit i of byte j
        first = 4 if bits >= 4 else 0
        for bit in range(first, bits):
            start = planes + (bit - first) * head_dim // 8
            assert ((packed[..., start] >> 1) & 1).tolist() == ((q[..., 1] >> bit) & 1).tolist()
            last = start + head_dim // 8 - 1  # the plane's last byte: channel head_dim - 1 in its bit 7
            assert ((packed[..., last] >> 7) & 1).tolist() == ((q[..., -1] >> bit) & 1).tolist()
        with pytest.raises(ValueError, match="multiple of 8"):
            pack(torch.zeros(1, 1, 12, dtype=torch.uint8), bits)
        with pytest.raises(ValueError, match="row"):
            unpack(torch.zeros(1, 1, bits * 8 + 1, dtype=torch.uint8), bits) if bits > 1 else unpack(packed, 9)


def test_a_plan_gives_each_layer_its_bits_and_its_error():
    from kvengine.quant import dequantize_kv, quantize_kv

    torch.manual_seed(0)
    x = torch.randn(4, 1, 2, 150, 64) * torch.linspace(0.1, 8, 64)  # [layers, 1, heads, tokens, head_dim]
    for axis in ("token", "channel"):
        parts = quantize_kv(x, "q4", axis=axis, bits=[3, 8, 5, 3])  # one number per layer: all its heads
        assert parts["bits"].tolist() == [[3, 3], [8, 8], [5, 5], [3, 3]] and parts["q"].dim() == 1
        assert parts["q"].numel() == 2 * (150 - 4) * (3 + 8 + 5 + 3) * 64 // 8  # each layer's width, no padding
        back = dequantize_kv(parts, "q4", torch.float32, axis=axis)
        assert back.shape == x.shape and torch.equal(back[..., :4, :], x[..., :4, :])
        for i, b in enumerate([3, 8, 5, 3]):  # each layer is what quantizing it alone with its bits gives
            alone = dequantize(quantize(x[i, ..., 4:, :], "q4", axis=axis, bits=b), "q4", torch.float32, axis=axis, bits=b)
            assert torch.allclose(back[i, ..., 4:, :], alone, atol=1e-5 * x.abs().amax())
        err = [(back[i, ..., 4:, :] - x[i, ..., 4:, :]).pow(2).mean() for i in range(4)]
        assert err[1] < err[2] / 16 < err[0] / 64  # 3 more bits: 1/64 of the squared error, or less
        uniform = quantize_kv(x, "q4", axis=axis)
        five = 5 if axis == "channel" else 4
        assert uniform["bits"].tolist() == [[five] * 2] * 4
        with pytest.raises(ValueError, match="layers"):
            quantize_kv(x, "q4", axis=axis, bits=[4, 4])
        with pytest.raises(ValueError, match="heads"):
            quantize_kv(x, "q4", axis=axis, bits=[[4, 4, 4], 4, 4, 4])
        with pytest.raises(ValueError, match="bits"):
            quantize_kv(x, "q8", axis=axis, bits=[4, 8, 8, 8])  # q8 is 8 bits everywhere
        with pytest.raises(ValueError, match="bits"):
            quantize_kv(x, "q4", axis=axis, bits=[1, 4, 4, 4])
        cut = dict(parts, q=parts["q"][:-1])  # a byte short: refused, not read as other positions
        with pytest.raises(ValueError, match="whole number"):
            dequantize_kv(cut, "q4", torch.float32, axis=axis)
        with pytest.raises(ValueError, match="layer or head count"):
            dequantize_kv(dict(parts, bits=parts["bits"][:3]), "q4", torch.float32, axis=axis)
        with pytest.raises(ValueError, match="layer or head count"):
            dequantize_kv(dict(parts, bits=parts["bits"][:, :1]), "q4", torch.float32, axis=axis)


def test_a_plan_gives_each_head_its_bits_and_its_error():
    # a layer's KV heads differ in sensitivity up to 470x (SmolLM2's layer 18 keys), so a plan names each
    from kvengine.quant import dequantize_kv, quantize_kv

    torch.manual_seed(0)
    x = torch.randn(3, 1, 3, 90, 64) * torch.linspace(0.1, 8, 64)  # [layers, 1, heads, tokens, head_dim]
    plan = [[3, 8, 5], [6, 6, 6], [2, 7, 4]]
    for axis in ("token", "channel"):
        parts = quantize_kv(x, "q4", axis=axis, bits=plan)
        assert parts["bits"].tolist() == plan and parts["bits"].dtype == torch.uint8
        assert parts["q"].numel() == (90 - 4) * sum(map(sum, plan)) * 64 // 8  # each head's width, no padding
        assert parts["scale"].shape[:3] == (3, 1, 3) and parts["zero"].shape[:3] == (3, 1, 3)
        back = dequantize_kv(parts, "q4", torch.float32, axis=axis)
        assert back.shape == x.shape and torch.equal(back[..., :4, :], x[..., :4, :])
        err = {}
        for layer, row in enumerate(plan):
            for head, b in enumerate(row):  # each head is what quantizing it alone with its bits gives
                alone = dequantize(quantize(x[layer, 0, head, 4:], "q4", axis=axis, bits=b), "q4", torch.float32, axis=axis, bits=b)
                assert torch.equal(back[layer, 0, head, 4:], alone), (layer, head)
                err[b] = (back[layer, 0, head, 4:] - x[layer, 0, head, 4:]).pow(2).mean()
        assert err[8] < err[5] / 16 < err[2] / 64  # 3 more bits: 1/64 of the squared error, or less
        # the codes run head by head in (layer, head) order: head (0, 1)'s 8-bit codes follow head (0, 0)'s 3-bit ones
        start = (90 - 4) * 3 * 64 // 8
        assert torch.equal(parts["q"][start : start + (90 - 4) * 64], quantize(x[0, 0, 1, 4:], "q4", axis=axis, bits=8)["q"].reshape(-1))


def test_bit_plan_is_the_calibrated_one_for_its_weights_and_uniform_for_others(monkeypatch):
    import json

    import kvengine.plans
    from kvengine.blocks import key_digest
    from kvengine.quant import bit_plan

    plans = json.loads(quant_module.PLANS_FILE.read_text())["plans"]
    assert plans, "q4_plans.json holds SmolLM2's calibrated plan"
    for fingerprint, plan in plans.items():
        layers, heads = len(plan["k"]), len(plan["k"][0])  # per layer, a list of each KV head's bits
        got = bit_plan("q4", layers, heads, fingerprint)
        assert got == {kind: tuple(tuple(row) for row in plan[kind]) for kind in "kv"}
        # the size stays the uniform plan's: the same bits in total, only placed where the divergence is
        assert sum(map(sum, got["k"])) + sum(map(sum, got["v"])) == layers * heads * (5 + 4)
        assert bit_plan("q8", layers, heads, fingerprint) == {kind: ((8,) * heads,) * layers for kind in "kv"}
        for wrong in ((layers + 1, heads), (layers, heads + 1)):
            with pytest.raises(ValueError, match="does not fit"):
                bit_plan("q4", *wrong, fingerprint)
    assert bit_plan("q4", 2, 3, "another model") == {"k": ((5, 5, 5),) * 2, "v": ((4, 4, 4),) * 2}
    # a plan is part of a block's key: after a recalibration no block of the old plan is reused (blocks.py)
    fingerprint = next(iter(plans))
    compat = {"backend": "transformers", "weights_fingerprint": fingerprint, "quant": "q4"}
    before = {q: key_digest({**compat, "quant": q}) for q in ("q4", "q8")}
    recalibrated = {fingerprint: {"k": [5] * 30, "v": [4] * 30}}
    monkeypatch.setattr(kvengine.plans, "_plans", lambda: recalibrated)
    assert key_digest(compat) != before["q4"] and key_digest({**compat, "quant": "q8"}) == before["q8"]
    # a plan may give a whole layer one number (a per-layer plan): every head of it gets those bits
    monkeypatch.setattr(kvengine.plans, "_plans", lambda: {fingerprint: {"k": [5, [3, 6, 7]], "v": [4, 4]}})
    assert bit_plan("q4", 2, 3, fingerprint) == {"k": ((5, 5, 5), (3, 6, 7)), "v": ((4, 4, 4), (4, 4, 4))}
    # a plan file that does not fit the model or the format is refused, not half-applied
    for broken in ({"k": [5] * 29, "v": [4] * 30}, {"k": [9] * 30, "v": [4] * 30}, {"k": [5] * 30, "v": [1] * 30},
                   {"k": [[5, 5]] * 30, "v": [4] * 30}, {"k": [[5, 5, 9]] * 30, "v": [4] * 30}, {"k": ["five"] * 30, "v": [4] * 30},
                   {"k": [[5, [5], 5]] * 30, "v": [4] * 30}, {"k": [5] * 30}, {"k": [5.9] * 30, "v": [4] * 30},
                   {"k": ["5"] * 30, "v": [4] * 30}, {"k": [True] * 30, "v": [4] * 30}, {"k": [[5.5, 5, 5]] * 30, "v": [4] * 30},
                   {"k": [float("inf")] * 30, "v": [4] * 30}, {"k": 5, "v": [4] * 30}, {"k": "5" * 30, "v": [4] * 30}, [5] * 30, "plan"):
        monkeypatch.setattr(kvengine.plans, "_plans", lambda broken=broken: {fingerprint: broken})
        with pytest.raises(ValueError, match="does not fit"):
            bit_plan("q4", 30, 3, fingerprint)
        assert len(key_digest(compat)) == 64  # the model-free web process keys blocks by it: it must not crash


def test_a_forged_quantized_part_is_refused_as_corrupt_before_it_is_decoded():
    from kvengine.errors import CorruptCartridgeError
    from kvengine.format import RawTensor
    from kvengine.payload import part_serve, quantize_layers

    torch.manual_seed(0)
    keys = [torch.randn(1, 2, 40, 16) for _ in range(3)]
    values = [torch.randn(1, 2, 40, 16) for _ in range(3)]
    plan = {"k": ((3, 6), (5, 5), (2, 8)), "v": ((4, 4), (3, 7), (4, 4))}
    stored = quantize_layers(keys, values, "q4", exact=4, plan=plan)

    def serve(tensors):
        return part_serve(tensors, num_layers=3, num_tokens=40, quant="q4", dtype=torch.float32, device="cpu", kv_shape=(2, 16))

    served_keys, _ = serve(stored)
    assert len(served_keys) == 3 and served_keys[0].shape == (1, 2, 40, 16)
    f32_bits = RawTensor("F32", (3, 2), torch.tensor([3.9, 6.2, 5.5, 5, 2, 8]).numpy().tobytes())
    forgeries = {
        "float bits": {"k.bits": f32_bits},
        "bits per layer, not per head": {"k.bits": RawTensor("U8", (3,), bytes([3, 6, 5]))},
        "bits of another shape": {"k.bits": RawTensor("U8", (2, 3), bytes([3, 6, 5, 5, 2, 8]))},
        "bits that do not fit the codes": {"k.bits": RawTensor("U8", (3, 2), bytes([8] * 6))},
        "bits out of range": {"v.bits": RawTensor("U8", (3, 2), bytes([0, 9, 4, 4, 4, 4]))},
        "a huge head_dim": {"k.exact": RawTensor("F32", (3, 1, 2, 0, 65536), b"")},
        "another head count": {"v.exact": RawTensor("F32", (3, 1, 3, 4, 16), bytes(3 * 3 * 4 * 16 * 4))},
        "fewer key groups": {"k.scale": RawTensor("F16", (3, 1, 2, 16, 0), b"")},
        "no value groups": {"v.zero": RawTensor("U8", (3, 1, 2, 36, 0), b"")},
        "signed codes": {"k.q": RawTensor("I8", stored["k.q"].shape, stored["k.q"].data)},
        # one position's codes, a whole number of positions: broadcast over all 36 they would decode as 36 positions
        "one position of value codes": {"v.q": RawTensor("U8", (sum(map(sum, plan["v"])) * 2,), bytes(stored["v.q"].data)[: sum(map(sum, plan["v"])) * 2])},
        "a position too many": {"k.q": RawTensor("U8", (stored["k.q"].shape[0] + sum(map(sum, plan["k"])) * 2,),
                                                 bytes(stored["k.q"].data) + bytes(sum(map(sum, plan["k"])) * 2))},
        "exact positions in another dtype": {"k.exact": RawTensor("F16", (3, 1, 2, 4, 16), bytes(3 * 2 * 4 * 16 * 2))},
    }
    for name, forged in forgeries.items():
        with pytest.raises(CorruptCartridgeError):
            serve({**stored, **forged})
            pytest.fail(name)
    # one width everywhere (q8, a uniform q4) decodes the codes in one view: a short q would broadcast, not fail
    for quant, per_position in (("q8", 3 * 2 * 16), ("q4", 3 * 2 * 4 * 16 // 8)):
        uniform = quantize_layers(keys, values, quant, exact=4)
        part_serve(uniform, num_layers=3, num_tokens=40, quant=quant, dtype=torch.float32, device="cpu", kv_shape=(2, 16))
        short = {**uniform, "v.q": RawTensor("U8", (per_position,), bytes(uniform["v.q"].data)[:per_position])}
        with pytest.raises(CorruptCartridgeError, match="code bytes"):
            part_serve(short, num_layers=3, num_tokens=40, quant=quant, dtype=torch.float32, device="cpu", kv_shape=(2, 16))


def test_q4_keys_get_five_bits_and_about_a_quarter_of_the_squared_error_of_four():
    # q4's keys carry most of its divergence, so they get 5 bits (docs/design/quantization.md)
    assert quant_module.AXIS_BITS[("q4", "channel")] == 5 and quant_module.AXIS_BITS[("q4", "token")] == 4
    torch.manual_seed(0)
    x = torch.randn(1, 3, 256, 64) * torch.linspace(0.1, 8, 64)
    five = (dequantize(quantize(x, "q4", axis="channel"), "q4", torch.float32, axis="channel") - x).pow(2).mean()
    saved = dict(quant_module.AXIS_BITS)
    try:
        quant_module.AXIS_BITS[("q4", "channel")] = 4
        four = (dequantize(quantize(x, "q4", axis="channel"), "q4", torch.float32, axis="channel") - x).pow(2).mean()
    finally:
        quant_module.AXIS_BITS.clear()
        quant_module.AXIS_BITS.update(saved)
    assert five < 0.3 * four  # half the step: a quarter of the squared error


def test_rotation_is_orthonormal_and_quantization_inverts_it():
    h = hadamard(64)
    assert torch.allclose(h @ h.T, torch.eye(64), atol=1e-6) and hadamard(48) is None
    torch.manual_seed(0)
    x = torch.randn(1, 3, 100, 64)
    x[..., 5] *= 30  # an outlier channel, as keys have: rotation spreads it, so q4's error shrinks
    errors = {}
    for rotate in (False, True):
        quant_module.ROTATE[("q4", "token")] = rotate
        try:
            errors[rotate] = (dequantize(quantize(x, "q4", axis="token"), "q4", torch.float32, axis="token") - x).norm()
        finally:
            quant_module.ROTATE[("q4", "token")] = True
    assert errors[True] < 0.5 * errors[False]


# q8 in 16-value groups: (16 + 4) / 64 = 0.3125 of float32
@pytest.mark.parametrize(("quant", "limit"), [("q8", 0.32), ("q4", 0.16)])
@pytest.mark.parametrize("num_tokens", [1000, 2000, 8000])
def test_stored_parts_are_a_fraction_of_float32(quant, limit, num_tokens):
    x = torch.randn(1, 3, num_tokens, 64)
    stored = sum(t.numel() * t.element_size() for axis in ("token", "channel") for t in quantize(x, quant, axis=axis).values())
    assert stored / (2 * x.numel() * 4) <= limit


def test_it_refuses_values_beyond_the_float16_parameters_range():
    x = torch.full((1, 1, 4, 64), 2e4)
    x[..., 1] = -2e4
    with pytest.raises(ValueError, match="float16"):
        quantize(x, "q8", axis="token")


def test_it_refuses_an_unknown_quant_or_axis():
    with pytest.raises(ValueError, match="quant"):
        quantize(torch.zeros(1, 1, 1, GROUP_SIZE), "q3", axis="token")
    with pytest.raises(ValueError, match="axis"):
        quantize(torch.zeros(1, 1, 1, GROUP_SIZE), "q8", axis="head")


@pytest.mark.parametrize("num_tokens", [1, 3, 4, 5, 70])
@pytest.mark.parametrize("quant", ["q8", "q4"])
def test_cartridge_quantization_keeps_the_leading_sink_positions_exact(num_tokens, quant):
    from kvengine.quant import EXACT_PREFIX_TOKENS, dequantize_kv, quantize_kv

    torch.manual_seed(num_tokens)
    x = torch.randn(1, 3, num_tokens, 64) * 3
    x[:, :, 0] *= 50  # an attention sink's large activations must not widen anyone else's grid
    for axis in ("token", "channel"):
        parts = quantize_kv(x, quant, axis=axis)
        exact = min(EXACT_PREFIX_TOKENS, num_tokens)
        assert parts["exact"].shape == (1, 3, exact, 64) and torch.equal(parts["exact"], x[:, :, :exact])
        back = dequantize_kv(parts, quant, torch.float32, axis=axis)
        assert back.shape == x.shape
        assert torch.equal(back[:, :, :exact], x[:, :, :exact])
        rest = x[:, :, exact:] @ hadamard(64)  # the grid is in the rotated space
        if rest.numel():  # the rest is quantized on its own range, within half a step
            scale = expand(parts["scale"], axis, rest.shape, quant)
            back_rest = back[:, :, exact:] @ hadamard(64)
            assert torch.all((back_rest - rest).abs() <= scale / 2 * (1 + 1e-5) + 1e-5 * rest.abs().amax())
            levels = 2 ** quant_module.AXIS_BITS[(quant, axis)] - 1  # q4's keys: 5 bits
            assert scale.max() <= (rest.max() - rest.min()) / levels * 1.01
