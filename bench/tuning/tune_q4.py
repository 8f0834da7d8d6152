"""Choose q4's method by the teacher-forced divergence (kvengine.divergence) on SQuAD scopes the final run never sees.

Each candidate fake-quantizes a q4 cartridge's keys and values (quantize, then dequantize at once, so the
served KV is what that format would serve) by patching kvengine.payload's quantize_kv/dequantize_kv, compiles
block on block as served, and teacher-forces the f32 cartridge's greedy answers through it. Sizes are the
formats' bits per value (codes + group parameters) over f32's 32, the exact first positions not counted.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/tuning/tune_q4.py --squad-file /tmp/squad.json \
        --out bench/results/kveval-q4/tune_q4.json
"""
from __future__ import annotations

import json
import time

import torch

import kvengine.payload as payload
import kvengine.quant as quant
import kvengine.transformers_backend as tb
from bench.tuning import divergence, f32_references, parser
from kvengine import make_backend

ROPE = {"theta": 100000.0, "first": 0}  # set by main() from the model config, and per part by the patched part_store


def _rope(x: torch.Tensor, first: int, sign: float) -> torch.Tensor:
    """Apply (sign=1) or undo (sign=-1) Llama's rotate-half rope on x [..., T, D] at positions first, first+1, ..."""
    t, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (ROPE["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.arange(first, first + t, dtype=torch.float64)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().float(), emb.sin().float()
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + sign * half * sin


def fake(x: torch.Tensor, *, bits: int, group: int, axis: str, rotate: bool = True, param_bits: int = 16,
         prerope: bool = False, first: int = 0, int_zero: bool = False) -> torch.Tensor:
    """x [..., T, D] quantized asymmetrically in groups (keys: along tokens; values: along head_dim) and back.

    param_bits < 16: the group's scale and minimum are themselves quantized to that many bits against the
    largest of the tensor's (per channel or per token row) -- what k-quants-style super-groups do.
    """
    x = x.float()
    if prerope:
        x = _rope(x, first, -1.0)
    d = x.shape[-1]
    h = quant.hadamard(d) if rotate else None
    if h is not None:
        x = x @ h
    if axis == "token":
        xg = x.reshape(*x.shape[:-1], d // group, group)
    else:
        t = x.shape[-2]
        pad = -t % group
        xt = x.transpose(-1, -2)
        if pad:
            xt = torch.cat([xt, xt[..., -1:].expand(*xt.shape[:-1], pad)], dim=-1)
        xg = xt.reshape(*xt.shape[:-1], (t + pad) // group, group)
    lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
    levels = 2**bits - 1
    scale = (hi - lo) / levels
    if int_zero:  # an integer zero point (GPTQ-style): a float16 step and the code that stands for 0
        scale = quant._f16_up(((hi - lo) / levels).squeeze(-1)).float().unsqueeze(-1)
        safe = torch.where(scale > 0, scale, 1)
        z = (-lo / safe).round().clamp(0, levels)
        q = torch.where(scale > 0, ((xg / safe).round() + z).clamp(0, levels), 0)
        yg = (q - z) * scale
        y = yg.reshape(x.shape) if axis == "token" else yg.reshape(*yg.shape[:-2], -1)[..., : x.shape[-2]].transpose(-1, -2)
        if h is not None:
            y = y @ h.T
        return _rope(y, first, 1.0) if prerope else y
    if param_bits < 16:  # quantize scale (up) and min (down) on a per-row grid
        pl = 2**param_bits - 1
        smax = scale.amax(-2, keepdim=True).clamp_min(1e-12) / pl
        scale = torch.ceil(scale / smax) * smax
        mabs = lo.abs().amax(-2, keepdim=True).clamp_min(1e-12)
        mstep = 2 * mabs / pl
        lo = torch.floor((lo + mabs) / mstep) * mstep - mabs
        scale = torch.maximum(scale, (hi - lo) / levels)
        scale = torch.ceil(scale / smax) * smax
    else:
        lo, scale = lo.half().float(), scale.half().float()
    q = torch.where(scale > 0, ((xg - lo) / torch.where(scale > 0, scale, 1)).round().clamp(0, levels), 0)
    yg = q * scale + lo
    if axis == "token":
        y = yg.reshape(x.shape)
    else:
        y = yg.reshape(*yg.shape[:-2], -1)[..., : x.shape[-2]].transpose(-1, -2)
    if h is not None:
        y = y @ h.T
    if prerope:
        y = _rope(y, first, 1.0)
    return y


CANDIDATES = {  # name -> {axis: fake-quant kwargs or None (exact)}, bits per value; None: kvengine.quant as it is
    "kvengine.quant (real format)": (None, None),
    "q4 k4 v4 g32 rot": ({"channel": dict(bits=4, group=32), "token": dict(bits=4, group=32)}, 5.0),
    "keys exact, values q4 v32": ({"channel": None, "token": dict(bits=4, group=32)}, None),
    "keys q4 k32, values exact": ({"channel": dict(bits=4, group=32), "token": None}, None),
    "keys q4 k32 pre-rope, values exact": ({"channel": dict(bits=4, group=32, prerope=True), "token": None}, None),
    "q4 k32 pre-rope v32": ({"channel": dict(bits=4, group=32, prerope=True), "token": dict(bits=4, group=32)}, 5.0),
    "k5g64 v4g64": ({"channel": dict(bits=5, group=64), "token": dict(bits=4, group=64)}, 5.0),
    "k5g64 v4g64 v-params8": ({"channel": dict(bits=5, group=64), "token": dict(bits=4, group=64, param_bits=8)}, (5.5 + 4.25) / 2),
    "k5g64 v4g64 params8": ({"channel": dict(bits=5, group=64, param_bits=8), "token": dict(bits=4, group=64, param_bits=8)}, (5.25 + 4.25) / 2),
    "k5g32 v4g64": ({"channel": dict(bits=5, group=32), "token": dict(bits=4, group=64)}, 5.25),
    "k5g128 v4g32": ({"channel": dict(bits=5, group=128), "token": dict(bits=4, group=32)}, 5.125),
    "k6g128 v4g64": ({"channel": dict(bits=6, group=128), "token": dict(bits=4, group=64)}, 5.375),
    "k5g64 v4g64 v-intzero": ({"channel": dict(bits=5, group=64), "token": dict(bits=4, group=64, int_zero=True)}, (5.5 + 4 + 20 / 64) / 2),
    "k5g64 v4g64 intzero": ({"channel": dict(bits=5, group=64, int_zero=True), "token": dict(bits=4, group=64, int_zero=True)}, (5 + 21 / 64 + 4 + 20 / 64) / 2),
    "k5g32 v4g64 intzero": ({"channel": dict(bits=5, group=32, int_zero=True), "token": dict(bits=4, group=64, int_zero=True)}, (5 + 21 / 32 + 4 + 20 / 64) / 2),
    "k4 per-token g32 v4g32": ({"channel": dict(bits=4, group=32, axis_override="token"), "token": dict(bits=4, group=32)}, 5.0),
}


ORIGINAL = (payload.quantize_layers, payload.dequantize_layers)


def patch(spec: dict | None) -> None:
    if spec is None:
        payload.quantize_layers, payload.dequantize_layers = ORIGINAL
        return

    def quantize_kv(x, q, *, axis, exact=quant.EXACT_PREFIX_TOKENS):
        exact = min(exact, x.shape[-2])
        rest = x[..., exact:, :]
        kw = spec[axis]
        if kw is not None and kw.get("prerope"):
            kw = {**kw, "first": ROPE["first"] + exact}
        if kw is not None and "axis_override" in kw:
            kw = dict(kw)
            axis = kw.pop("axis_override")
        return {"exact": x[..., :exact, :].contiguous(), "deq": rest.float() if kw is None else fake(rest, axis=axis, **kw)}

    def dequantize_kv(parts, q, dtype, *, axis):
        return torch.cat([parts["exact"].to(dtype), parts["deq"].to(dtype)], dim=-2)

    def quantize_layers(keys, values, q, *, exact=quant.EXACT_PREFIX_TOKENS, plan=None):  # a candidate's bits, not a plan's
        out = {}
        for kv, t in (("k", keys), ("v", values)):
            for part, tensor in quantize_kv(torch.stack(list(t)), q, axis=payload.QUANT_AXIS[kv], exact=exact).items():
                out[f"{kv}.{part}"] = payload.to_raw(tensor.contiguous())
        return out

    def dequantize_layers(stored, num_layers, q, dtype, device):
        return tuple(
            list(dequantize_kv({part: payload.from_raw(stored[f"{kv}.{part}"]) for part in ("exact", "deq")}, q, dtype,
                               axis=payload.QUANT_AXIS[kv]).unbind(0))
            for kv in "kv"
        )

    payload.quantize_layers = quantize_layers
    payload.dequantize_layers = dequantize_layers


_part_store = tb.part_store


def _part_store_at(*args, first_position, **kw):
    ROPE["first"] = first_position
    return _part_store(*args, first_position=first_position, **kw)


tb.part_store = _part_store_at


def main() -> None:
    a = parser(scopes=4, questions=48, only_sep=";").parse_args()
    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    ROPE["theta"] = float(getattr(f32.model.config, "rope_theta", None) or f32.model.config.rope_parameters["rope_theta"])
    refs = f32_references(f32, a)
    results = {}
    only = [n for n in a.only.split(";") if n]
    for name, (spec, bits) in CANDIDATES.items():
        if only and name not in only:
            continue
        patch(spec)
        start = time.perf_counter()
        d, size = divergence(f32.variant(quant="q4"), refs)
        d["bits_per_value"] = bits
        d["size_vs_f32"] = size if spec is None else None if bits is None else bits / 32  # a fake format's bytes mean nothing
        d["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = d
        print(f"{name}: mean KL {d['mean_kl']:.3e} p95 {d['p95_kl']:.3e} max {d['max_kl']:.3e} first {d['first_token_mean_kl']:.3e} "
              f"top1 {100 * d['top1_per_position']:.2f}% ({d['num_positions']} pos) bits {bits} size {d['size_vs_f32']} {d['seconds']}s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"scopes": [(s.article, s.num_tokens) for s in refs.scopes], "questions": len(refs.refs), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
