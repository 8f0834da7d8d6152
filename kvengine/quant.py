"""KV quantization for stored cartridges: q8 (8-bit) and q4 (4-bit values, 5-bit keys on average, bit-packed).

Format 8: a plan gives each KV head of a layer its own bits. Within one of SmolLM2's
layers the three KV heads' sensitivities differ up to 470x (layer 18's keys: 2.1e-6, 1.5e-6 and 7.0e-4; one head
carries the layer), measured as format 7's were but one head at a time (heads_q4.py, sensitivity_heads_{k,v}.json).
The same allocation over the 180 (kind, layer, head) units, the same total bits (so the same size), lowered the
fake-quantized mean KL on held-out articles from format 7's 5.61e-4 to 4.95e-4 (articles 25-28) and from 5.81e-4
to 4.69e-4 (29-32): validate_heads_skip{24,28}.json (the additive model had predicted 1.55x; heads of one layer do
not add up exactly). Parts store "bits" as uint8 [layers, heads] and the codes head by head in (layer, head) order,
so a uniform plan's codes are laid out as format 7's. A plan may still give a whole layer one number.

Format 7: q4's bits differ by layer, spent where the divergence is, the total kept.
On format 6's q4, quantizing one of SmolLM2's 30 layers alone (keys at 4 bits or values at 3, the rest exact) gave
a mean KL per position from 1.5e-6 to 7.1e-4: layers 18 and 23 carried ~60% of the keys' divergence and ~40% of
the values' (bench/tuning/calibrate_q4.py, sensitivity_k.json / sensitivity_v.json; articles 21-24).
A plan moves bits between layers, keys and values by those measurements, at the same total bits, so the same
size (calibrate_q4.py's allocate: a bit quarters a layer's divergence; greedy moves while they lower the sum):
SmolLM2's keys get 3-7 bits, its values 3-6. On held-out articles (25-28 and 29-32) that lowered the fake-quantized
mean KL from 8.3e-4 to 5.6e-4 and from 1.05e-3 to 5.8e-4 (validate_skip24.json, validate_skip28.json). A plan
belongs to one model's weights (q4_plans.json, keyed by the weights fingerprint; plans.py): bit_plan() gives every
other model format 6's uniform 5 and 4 bits, and a plan is part of a block's key (blocks.key_digest). Each quantized part stores its layers' bits ("bits"), so a cartridge decodes
without the plan; its codes are packed per layer (pack(): bits * head_dim / 8 bytes a row, format 6's layout
at 4 and 5 bits) and concatenated in layer order.

Format 6: q4 spends its bits where the error is. Measured with the teacher-forced
divergence on 4 budget-1024 SQuAD scopes of articles 21-24 (never those of the 200-question kveval run), 48
questions, 802 positions, fake-quantizing one tensor at a time (bench/tuning/tune_q4.py, tune_q4.json):
format 5's q4 (4-bit keys and values, 32-value groups, rotated) had mean KL 2.07e-3; with exact values it was
1.38e-3, with exact keys 3.3e-4: the keys carry 80% of it. So q4's keys get 5 bits in 64-token groups and its
values 4 bits in 64-value groups (a whole SmolLM2 head per token). Mean KL per position / bits per value:

    k4 g32, v4 g32 (format 5)              2.07e-3  5.00
    k4 g32 pre-rope keys, v4 g32           1.97e-3  5.00   (un-roped before the rotation: no gain)
    k4 per-token g32, v4 g32               6.0e-3   5.00
    k5 g32, v4 g64                         8.6e-4   5.25
    k5 g64, v4 g64                         9.1e-4   5.00
    k5 g64, v4 g64 integer zero (format 6) 1.01e-3  4.94
    k5 g128, v4 g32                        1.01e-3  5.13
    k6 g128, v4 g64                        6.6e-4   5.38
    k5 g64 integer zero, v4 g64 int. zero  4.4e-3   4.82   (keys' groups rarely straddle 0)

The values' zero point is an integer code (uint8, GPTQ-style: the grid holds 0, which a rotated head's values
always straddle), one byte instead of a float16's two, so q4 stays under 0.16x of f32 with the exact first
positions and the headers of a 1k-token cartridge (5.0 bits gave 0.161 there). 9.1e-4 and 1.01e-3 are within
the measure's noise on 802 positions (two encodings of the same grid gave 9.1e-4 and 9.6e-4). Codes are packed
two 4-bit codes a byte along head_dim (the low nibble is the even channel, as in format 5); 5-bit codes keep
their low 4 bits so and add their fifth bits as one bit plane (pack()).

Format 5: q8's groups are 16 values long on both axes
(keys: 16 consecutive tokens per channel; values: 16 consecutive head_dim values per token), 64 before;
q4 is unchanged (32). Why: on SQuAD scopes packed from many articles q8 answers had matched f32 on 97% of 200
questions, short of the 98% target (kveval.runner), although its mean KL was ~1e-5: the misses are near-ties, and only a
smaller error moves fewer of them. Chosen by the teacher-forced divergence (kvengine.divergence) of format-4
block cartridges (each 256-token block prefilled over the previous blocks' dequantized KV) on 4 budget-1024
scopes of articles 21-24 of SQuAD dev (Black_Death, Geology, Newcastle_upon_Tyne, Victoria_and_Albert_Museum;
never those of the 200-question kveval run), 48 questions, 16-token f32 answers, 802 positions
(bench/tuning/tune_q8.py, tune_q8.json). Mean KL / p95 / first-token KL / top-1 per position
/ size vs f32:

    k64 v64 rotated (format 4)  1.02e-5  2.99e-5  7.3e-6  99.88%  0.269
    k32 v32 rotated             6.86e-6  2.91e-5  2.7e-6  99.88%  0.285
    k32 v32 not rotated         1.55e-5  4.20e-5  4.9e-6  99.88%  0.285
    k32 v64 rotated             8.96e-6  2.56e-5  3.0e-6  99.88%  0.277
    k64 v32 rotated             1.01e-5  3.77e-5  7.0e-6  99.88%  0.277
    k16 v16 rotated (format 5)  4.57e-6  1.58e-5  2.3e-6  100.00% 0.316

The rotation still pays at q8 (2.3x lower mean KL at 32), finer key groups are what lower the first-token KL,
and 16/16 is the lowest on every measure and the only one with no position's argmax changed, for 0.047x of
f32 more than format 4 (q8 stays under a third of f32). 16 divides the block (BLOCK_SIZE), so key groups never
straddle a block boundary (blocks.py); block 0's quantized part starts after the EXACT_PREFIX_TOKENS exact
positions, so its last key group is 12 tokens (padded as any short group is). The 200-question measurement
on other articles is in BENCHMARKS.md (section "q8 in 16-value groups").

Format 3: before grouping, keys and values are rotated along head_dim by the orthonormal
Hadamard matrix H (as QuaRot and llama.cpp's rotated q4 do); dequantization multiplies by H^T. A rotation
spreads a few outlier channels over all of them, so a group's range is set by typical values. q4 groups
are 32 values long (q8 stays at 64). Chosen by the teacher-forced divergence to f32 (kvengine.divergence)
on SQuAD scopes of 3-4 articles at 1k tokens, 27-36 answers (~300-900 positions), mean KL per position:
q4 64 no rotation 0.0078 (p95 0.030); q4 32 no rotation 0.0047; q4 32 values rotated 0.0046; q4 32 keys
rotated 0.0019; q4 32 both rotated 0.0015 (p95 0.0069); q4 64 both rotated 0.0030. q8 64 (1e-5) and
q8 64 rotated (1e-5, top-1 per position 100% against 99.7%) are both far below the 1e-3 target; q8 kept
64-value groups and its 0.266x size, with the rotation (until format 5, above). Format 2 (64-value groups, no rotation) is below.

Both are asymmetric (a float16 zero point at the group minimum and a float16 step; q4's values since format 6:
an integer zero code), grouped 16 (q8, format 5) or 64 (q4, format 6; 32 before) values at a time, and grouped
the way each tensor's outliers run (as in KIVI, Liu et al. 2024):

- keys: per channel, groups of ``GROUP_SIZE`` consecutive tokens (a few key channels carry large values at
  every position; per-token groups would spend the whole 8 or 4 bits' range on them). This cut the key
  error on SmolLM2 from 1.1% to 0.25% (q8) and from 13% to 4% (q4);
- values: per token, groups of ``GROUP_SIZE`` consecutive head_dim values.

The step is rounded *up* to float16 and the zero point *down*, so every value lies inside the grid and the
round-trip error is at most half a step: ``|x - x̂| <= scale / 2`` with ``zero <= min(group)`` and
``scale >= (max(group) - zero) / (2**bits - 1)``. With an integer zero code (q4's values) the grid runs from
``-zero * scale`` over ``2**bits - 1`` steps with ``scale >= (max(group, 0) - min(group, 0)) / (2**bits - 1)``;
its ends are within half a step of the group's extremes (the zero code is rounded), so the bound is the same.

Sizes relative to float32 (scale + zero = 4 bytes a group; q4's are its average bits since format 7): q8 = (16 + 4) / 64 = 0.3125 (format 5; 0.266
with format 4's 64-value groups), q4 = ((40 + 4) + (32 + 3)) / 512 = 0.154 (format 6: 64 keys of 5 bits with a
float16 step and zero, 64 values of 4 bits with a float16 step and a uint8 zero code; 0.156 before; key groups
along tokens round the token count up to the group length for their parameters only, not for the codes).
Rotated values must stay inside float16's range (65504; a rotation can grow a value sqrt(head_dim) times):
quantize() raises ValueError otherwise; KV states are far smaller.
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

import functools
import math
from collections.abc import Sequence

import torch

from .plans import PLANS_FILE, calibrated_plan

EXACT_PREFIX_TOKENS = 4  # leading positions kept in the cartridge's own dtype (see the module docstring)
GROUP_SIZE = 16  # q8's group length, both axes (format 5; 64 before; q4's is Q4_GROUP_SIZE; module docstring)
Q4_GROUP_SIZE = 64  # q4's group length, both axes (format 6; 32 before)
BITS = {"q8": 8, "q4": 4}  # the quant's nominal bits: its values'
AXES = ("token", "channel")  # "token": values (groups along head_dim); "channel": keys (groups along tokens)
# per (quant, axis): the group length; token-axis groups are along head_dim, channel-axis groups along tokens
GROUPS = {("q8", "token"): GROUP_SIZE, ("q8", "channel"): GROUP_SIZE, ("q4", "token"): Q4_GROUP_SIZE, ("q4", "channel"): Q4_GROUP_SIZE}
# per (quant, axis): the bits of a code (q4's keys carry most of its error: 5 bits, format 6)
AXIS_BITS = {("q8", "token"): 8, ("q8", "channel"): 8, ("q4", "token"): 4, ("q4", "channel"): 5}
# per (quant, axis): the zero point is an integer code (uint8) on a grid that holds 0, instead of a float16 minimum
INT_ZERO = {("q8", "token"): False, ("q8", "channel"): False, ("q4", "token"): True, ("q4", "channel"): False}
# rotate along head_dim by an orthonormal Hadamard matrix before grouping (when head_dim is a power of two)
ROTATE: dict[tuple[str, str], bool] = {(q, axis): True for q in BITS for axis in AXES}
KINDS = {"k": "channel", "v": "token"}  # a cartridge's stored kinds and their axes: keys per channel, values per token
PLAN_BITS = range(2, 9)  # the bits a plan may give a KV head's keys or values


def bit_plan(quant: str, num_layers: int, num_heads: int, weights_fingerprint: str = "") -> dict[str, tuple[tuple[int, ...], ...]]:
    """Per layer and KV head, the bits of each stored kind ("k": keys, "v": values) of a ``quant`` cartridge.

    q4 (format 8): the plan calibrated for these exact weights in q4_plans.json (bench/tuning/
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


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack uint8 codes [..., D] of ``bits`` bits (1-8; D a multiple of 8 below 8 bits) along the last axis.

    8 bits: one a byte. From 4 bits: the low 4 bits two codes a byte, the even channel in the low nibble (format
    5's layout), then bits 4.. as one bit plane each; below 4: a plane per bit. A plane holds channel 8j + i in
    bit i of byte j. Either way a row is bits * D / 8 bytes (format 6's 4 and 5 bits are this layout).
    """
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

    Parts: "exact" (those positions as they are), "bits" (uint8 [layers, heads], format 8), "scale" and "zero"
    (stacked as the heads are) and "q": every head's packed codes [T, bits * D / 8] (quant.pack), flattened and
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
