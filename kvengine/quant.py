"""KV quantization for stored cartridges: q8 (8-bit) and q4 (4-bit values, 5-bit keys on average, bit-packed).

Both are asymmetric (a float16 step and a zero point per group), rotated along head_dim by an orthonormal
Hadamard matrix before grouping, and grouped the way each tensor's outliers run: keys per channel over
consecutive tokens, values per token over consecutive head_dim values. q4's bits come per layer and KV head
from a plan calibrated for the model's weights (bit_plan(), plans.py), else uniform; codes are bit-packed
(bitpack.py). The first ``EXACT_PREFIX_TOKENS`` positions (the template's attention sinks) stay exact.
Work is done in float32; dequantized values are cast to the serving dtype.

Design and the measurements behind each choice: docs/design/quantization.md.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from .bitpack import pack, unpack
from .plans import PLANS_FILE, calibrated_plan

EXACT_PREFIX_TOKENS = 4  # leading positions kept in the cartridge's own dtype: attention sinks (docs/design/quantization.md)
GROUP_SIZE = 16  # q8's group length, both axes: the lowest divergence measured, and it divides BLOCK_SIZE
Q4_GROUP_SIZE = 64  # q4's group length, both axes (a whole SmolLM2 head per token for values)
BITS = {"q8": 8, "q4": 4}  # the quant's nominal bits: its values'
AXES = ("token", "channel")  # "token": values (groups along head_dim); "channel": keys (groups along tokens)
# per (quant, axis): the group length; token-axis groups are along head_dim, channel-axis groups along tokens
GROUPS = {("q8", "token"): GROUP_SIZE, ("q8", "channel"): GROUP_SIZE, ("q4", "token"): Q4_GROUP_SIZE, ("q4", "channel"): Q4_GROUP_SIZE}
# per (quant, axis): the bits of a code (q4's keys carry most of its error: 5 bits)
AXIS_BITS = {("q8", "token"): 8, ("q8", "channel"): 8, ("q4", "token"): 4, ("q4", "channel"): 5}
# per (quant, axis): the zero point is an integer code (uint8) on a grid that holds 0, instead of a float16 minimum
INT_ZERO = {("q8", "token"): False, ("q8", "channel"): False, ("q4", "token"): True, ("q4", "channel"): False}
# rotate along head_dim by an orthonormal Hadamard matrix before grouping (when head_dim is a power of two)
ROTATE: dict[tuple[str, str], bool] = {(q, axis): True for q in BITS for axis in AXES}
KINDS = {"k": "channel", "v": "token"}  # a cartridge's stored kinds and their axes: keys per channel, values per token
PLAN_BITS = range(2, 9)  # the bits a plan may give a KV head's keys or values


def bit_plan(quant: str, num_layers: int, num_heads: int, weights_fingerprint: str = "") -> dict[str, tuple[tuple[int, ...], ...]]:
    """Per layer and KV head, the bits of each stored kind ("k": keys, "v": values) of a ``quant`` cartridge.

    q4: the plan calibrated for these exact weights in q4_plans.json (bench/tuning/
    calibrate_q4.py: each head's measured divergence decides its bits, the total kept; a plan may also give a
    whole layer one number), else every head at AXIS_BITS (keys 5, values 4). q8: 8 everywhere. ValueError if a
    plan does not fit the model.
    """
    _check(quant, "token")
    plan = {kind: ((AXIS_BITS[(quant, axis)],) * num_heads,) * num_layers for kind, axis in KINDS.items()}
    found = calibrated_plan(quant, weights_fingerprint)
    if found is None:
        return plan
    # exactly ints (JSON's 5.9, "5" or true are not bits), per layer one or a list of one per head
    calibrated = {kind: tuple(tuple(layer if isinstance(layer, list) else [layer] * num_heads) for layer in found[kind]) for kind in KINDS}
    if any(len(bits) != num_layers or any(len(layer) != num_heads or any(type(b) is not int or b not in PLAN_BITS for b in layer) for layer in bits)
           for bits in calibrated.values()):
        raise ValueError(f"the q4 plan for weights {weights_fingerprint[:12]} does not fit a {num_layers}-layer model with "
                         f"{num_heads} KV heads ({PLANS_FILE.name})")
    return calibrated


def group_size(head_dim: int, quant: str = "q8") -> int:
    """The group length along head_dim for values: GROUPS' when it divides head_dim, else head_dim itself."""
    g = GROUPS[(quant, "token")] if quant in BITS else GROUP_SIZE
    return g if head_dim % g == 0 else head_dim


def token_group(quant: str) -> int:
    """The group length along tokens (keys, per channel)."""
    return GROUPS[(quant, "channel")]


def hadamard(n: int) -> torch.Tensor | None:
    """The orthonormal Hadamard matrix of order ``n`` (a power of two), or None when ``n`` is not one."""
    if n < 1 or n & (n - 1):
        return None
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n**0.5


def _f16_up(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is >= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() < v, torch.nextafter(h, torch.full_like(h, float("inf"))), h)


def _f16_down(v: torch.Tensor) -> torch.Tensor:
    """Round float32 ``v`` to the nearest float16 that is <= v."""
    h = v.to(torch.float16)
    return torch.where(h.float() > v, torch.nextafter(h, torch.full_like(h, float("-inf"))), h)


def _check(quant: str, axis: str, bits: int | None = None) -> int:
    """The bits of a code: ``bits`` (a plan's: 2-8, q8's only 8) or AXIS_BITS'; ValueError for anything else."""
    if quant not in BITS:
        raise ValueError(f"`quant` has to be one of {list(BITS)} but got {quant!r}")
    if axis not in AXES:
        raise ValueError(f"`axis` has to be one of {list(AXES)} but got {axis!r}")
    if bits is None:
        return AXIS_BITS[(quant, axis)]
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in PLAN_BITS or (quant == "q8" and bits != 8):
        raise ValueError(f"`bits` has to be {'8' if quant == 'q8' else 'one of 2-8'} for {quant} but got {bits!r}")
    return bits


def code_bytes(bits: int, head_dim: int, quant: str, axis: str) -> int:
    """The bytes of one position's packed codes of one head at ``bits`` (pack()); ValueError for bits the format lacks."""
    return head_dim if _check(quant, axis, bits) == 8 else bits * head_dim // 8


def _grouped(x: torch.Tensor, axis: str, quant: str) -> torch.Tensor:
    """View ``x`` [..., T, D] as groups (..., num_groups, group) along the quantization axis."""
    *lead, t, d = x.shape
    if axis == "token":
        g = group_size(d, quant)
        return x.reshape(*lead, t, d // g, g)  # (..., T, D/g, g)
    g = token_group(quant)
    pad = -t % g
    xt = x.transpose(-1, -2)  # (..., D, T)
    if pad:  # repeat the last token: the group's min and max stay those of real tokens
        xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
    return xt.reshape(*lead, d, (t + pad) // g, g)  # (..., D, ceil(T/g), g)


def _ungrouped(xg: torch.Tensor, axis: str, num_tokens: int) -> torch.Tensor:
    """Invert _grouped: (..., num_groups, group) back to [..., T, D]."""
    if axis == "token":
        return xg.reshape(*xg.shape[:-2], xg.shape[-2] * xg.shape[-1])
    xt = xg.reshape(*xg.shape[:-2], -1)[..., :num_tokens]  # (..., D, T)
    return xt.transpose(-1, -2)


def quantize(x: torch.Tensor, quant: str, *, axis: str, bits: int | None = None) -> dict[str, torch.Tensor]:
    """Quantize ``x`` [..., num_tokens, head_dim] into parts "q" (packed codes), "scale" (float16) and "zero".

    "zero" is the group's float16 minimum, or (INT_ZERO) the uint8 code that stands for 0 on a grid from
    min(group, 0) to max(group, 0). Either way every value lies within half a step of its dequantized value.
    ``bits``: the codes' bits (a plan's, bit_plan()); None: AXIS_BITS'.
    """
    bits = _check(quant, axis, bits)
    levels = 2**bits - 1
    x = x.float()
    rot = _rotation(quant, axis, x.shape[-1], x.device)
    if rot is not None:
        x = x @ rot  # spread outliers over the head_dim before grouping
    xg = _grouped(x, axis, quant)
    lo, hi = xg.amin(-1), xg.amax(-1)  # (..., num_groups)
    if INT_ZERO[(quant, axis)]:
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
        scale = _f16_up((hi - lo) / levels)
        safe = torch.where(scale.float() > 0, scale.float(), 1.0)
        zero = (-lo / safe).round().clamp(0, levels).to(torch.uint8)  # lo/s + zero is within half a code of 0
        shifted = (xg / safe.unsqueeze(-1)).round() + zero.float().unsqueeze(-1)
    else:
        zero = _f16_down(lo)
        scale = _f16_up((hi - zero.float()) / levels)
        safe = torch.where(scale.float() > 0, scale.float(), 1.0)
        shifted = ((xg - zero.float().unsqueeze(-1)) / safe.unsqueeze(-1)).round()
    if x.numel() and not (x.abs().amax() < 65504 and torch.isfinite(zero).all() and torch.isfinite(scale).all()):
        raise ValueError("KV values are too large for float16 quantization parameters (|x| * sqrt(head_dim) must stay below 65504)")
    # a zero step means a constant group: its values sit on the zero point, which ``shifted`` already is there
    q = _ungrouped(shifted.clamp(0, levels).to(torch.uint8), axis, x.shape[-2]).contiguous()  # [..., T, D]
    return {"q": pack(q, bits), "scale": scale, "zero": zero}


def codes(parts: dict[str, torch.Tensor], quant: str, axis: str, bits: int | None = None) -> torch.Tensor:
    """The integer codes [..., T, D] (unpacked)."""
    return unpack(parts["q"], _check(quant, axis, bits))


def expand(param: torch.Tensor, axis: str, shape: torch.Size | tuple[int, ...], quant: str = "q8") -> torch.Tensor:
    """Broadcast a per-group parameter (scale or zero) of ``quant`` to the full tensor ``shape`` [..., T, D]."""
    *_, t, d = shape
    if axis == "token":
        return param.float().repeat_interleave(d // param.shape[-1], dim=-1)  # (..., T, D)
    return param.float().repeat_interleave(token_group(quant), dim=-1)[..., :t].transpose(-1, -2)  # (..., T, D)


def _rotation(quant: str, axis: str, head_dim: int, device: torch.device) -> torch.Tensor | None:
    return _hadamard_on(head_dim, str(device)) if ROTATE[(quant, axis)] else None


@functools.lru_cache(maxsize=8)
def _hadamard_on(head_dim: int, device: str) -> torch.Tensor | None:
    """hadamard() on ``device``, built once (a plan quantizes a part in several calls, one per bit width); read-only."""
    rot = hadamard(head_dim)
    return None if rot is None else rot.to(device)


def dequantize(parts: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, *, axis: str, bits: int | None = None) -> torch.Tensor:
    """Invert quantize() (with the same ``bits``): return [..., T, head_dim] in ``dtype``."""
    q = codes(parts, quant, axis, bits)
    if INT_ZERO[(quant, axis)]:
        x = (q.float() - expand(parts["zero"], axis, q.shape, quant)) * expand(parts["scale"], axis, q.shape, quant)
    else:
        x = q.float() * expand(parts["scale"], axis, q.shape, quant) + expand(parts["zero"], axis, q.shape, quant)
    rot = _rotation(quant, axis, x.shape[-1], x.device)
    if rot is not None:
        x = x @ rot.T
    return x.to(dtype)


def _unit_bits(bits: Sequence | torch.Tensor | None, quant: str, axis: str, num_layers: int, heads: int) -> torch.Tensor:
    """``bits`` as a uint8 [layers, heads] tensor: None (AXIS_BITS' everywhere), one number per layer (all its heads)
    or a row per layer of one number per head. ValueError if it does not fit or holds a width the format lacks."""
    if bits is None:
        return torch.full((num_layers, heads), AXIS_BITS[(quant, axis)], dtype=torch.uint8)
    rows = [row.tolist() if isinstance(row, torch.Tensor) else row for row in bits]
    if len(rows) != num_layers:
        raise ValueError(f"`bits` has to give each of the {num_layers} layers its bits but gives {len(rows)}")
    table = [list(row) if isinstance(row, (list, tuple)) else [row] * heads for row in rows]
    if any(len(row) != heads for row in table):
        raise ValueError(f"`bits` has to give a layer one number or one for each of its {heads} heads")
    for row in table:
        for b in row:
            _check(quant, axis, b)
    return torch.tensor(table, dtype=torch.uint8)


def quantize_kv(
    x: torch.Tensor, quant: str, *, axis: str, exact: int = EXACT_PREFIX_TOKENS, bits: Sequence | None = None
) -> dict[str, torch.Tensor]:
    """quantize() all but the first ``exact`` positions of ``x`` [layers, ..., T, D], each head (each row of the
    lead axes ``...``) of layer i with its own bits: ``bits`` per layer (a number, or one per head), None: AXIS_BITS'.

    Parts: "exact" (those positions as they are), "bits" (uint8 [layers, heads]), "scale" and "zero"
    (stacked as the heads are) and "q": every head's packed codes [T, bits * D / 8] (bitpack.pack), flattened and
    concatenated in (layer, head) order (their widths differ). Heads with equal bits are quantized together.
    """
    exact = min(exact, x.shape[-2])
    num_layers, lead, (t, d) = x.shape[0], tuple(x.shape[1:-2]), x.shape[-2:]
    heads = math.prod(lead)
    table = _unit_bits(bits, quant, axis, num_layers, heads)
    flat_bits = table.reshape(-1).tolist()
    units = x[..., exact:, :].reshape(num_layers * heads, t - exact, d)
    flat: list[torch.Tensor | None] = [None] * len(flat_bits)
    scale: torch.Tensor | None = None
    zero: torch.Tensor | None = None
    for b in sorted(set(flat_bits)):
        index = [i for i, unit_bits in enumerate(flat_bits) if unit_bits == b]
        parts = quantize(units if len(index) == len(flat_bits) else units[index], quant, axis=axis, bits=b)
        if scale is None or zero is None:
            scale = parts["scale"].new_empty(len(flat_bits), *parts["scale"].shape[1:])
            zero = parts["zero"].new_empty(len(flat_bits), *parts["zero"].shape[1:])
        scale[index], zero[index] = parts["scale"], parts["zero"]
        for row, i in enumerate(index):
            flat[i] = parts["q"][row].reshape(-1)
    assert scale is not None and zero is not None  # at least one head
    return {
        "exact": x[..., :exact, :].contiguous(), "q": torch.cat(flat),  # type: ignore[arg-type]
        "scale": scale.reshape(num_layers, *lead, *scale.shape[1:]), "zero": zero.reshape(num_layers, *lead, *zero.shape[1:]),
        "bits": table,
    }


def dequantize_kv(parts: dict[str, torch.Tensor], quant: str, dtype: torch.dtype, *, axis: str) -> torch.Tensor:
    """Invert quantize_kv(): the exact positions followed by the dequantized rest, [layers, ..., T, D] in ``dtype``.

    ValueError if the parts do not fit each other (layer or head count, bits, byte count).
    """
    exact, packed = parts["exact"], parts["q"].reshape(-1)
    num_layers, lead, d = exact.shape[0], tuple(exact.shape[1:-2]), exact.shape[-1]
    heads = math.prod(lead)
    if tuple(parts["bits"].shape) != (num_layers, heads):
        raise ValueError(f"quantized parts disagree on the layer or head count ({num_layers} x {heads} exact, bits {tuple(parts['bits'].shape)})")
    if parts["scale"].shape[: 1 + len(lead)] != exact.shape[:-2] or parts["zero"].shape[: 1 + len(lead)] != exact.shape[:-2]:
        raise ValueError("quantized parts disagree on the layer or head count (scale, zero)")
    bits = [int(b) for b in parts["bits"].reshape(-1).tolist()]
    widths = [code_bytes(b, d, quant, axis) for b in bits]
    per_token = sum(widths)
    num_tokens = packed.numel() // per_token if per_token else 0
    if num_tokens * per_token != packed.numel():
        raise ValueError(f"{packed.numel()} code bytes are not a whole number of positions of {per_token} bytes")
    if len(set(bits)) == 1:  # one width (q8, a uniform q4): the codes are already [layers, ..., T, width]
        group = {"q": packed.view(num_layers, *lead, num_tokens, widths[0]), "scale": parts["scale"], "zero": parts["zero"]}
        return torch.cat([exact.to(dtype), dequantize(group, quant, dtype, axis=axis, bits=bits[0])], dim=-2)
    chunks = packed.split([num_tokens * w for w in widths])
    scales = parts["scale"].reshape(len(bits), *parts["scale"].shape[1 + len(lead):])
    zeros = parts["zero"].reshape(len(bits), *parts["zero"].shape[1 + len(lead):])
    out = torch.empty(num_layers, *lead, exact.shape[-2] + num_tokens, d, dtype=dtype, device=packed.device)
    out[..., : exact.shape[-2], :] = exact
    rest = out.view(len(bits), exact.shape[-2] + num_tokens, d)[:, exact.shape[-2]:]  # per head, a view of ``out``
    for b in sorted(set(bits)):
        index = [i for i, unit_bits in enumerate(bits) if unit_bits == b]
        width = code_bytes(b, d, quant, axis)
        group = {"q": torch.stack([chunks[i] for i in index]).view(len(index), num_tokens, width), "scale": scales[index], "zero": zeros[index]}
        rest[index] = dequantize(group, quant, dtype, axis=axis, bits=b)
    return out
