"""Calibrate q4's bits per layer (format 7) by the teacher-forced divergence on SQuAD scopes the final run never sees.

Why: on format 6's q4 (keys 5 bits, values 4, every layer alike) two of SmolLM2's 30 layers (18 and 23) carried
about 60% of the keys' divergence and 40% of the values', and the least sensitive layers 1/300 of the most's. Spending
the same bits unevenly, where the divergence is, lowers it without a larger cartridge.

Method (as llama.cpp's importance-matrix quantization spends bits by measured sensitivity):

1. ``measure``: for each layer and kind (keys at ``--key-bits``, values at ``--value-bits``), fake-quantize that layer's
   kind alone (tune_q4.fake: the format's rotation, groups and float16 parameters), every other layer exact, and take
   the mean KL per position of f32's greedy answers, teacher-forced (bench/tuning.py). That is the layer's
   sensitivity s at those bits.
2. ``allocate``: model each unit's divergence as ``s * 4**(bits_measured - bits)`` (a bit halves the step: a quarter
   of the squared error), start from format 6's uniform bits and move single bits from the unit that loses least to
   the one that gains most while that lowers the sum; the total bits (so the size) stay format 6's. Bits stay in
   3..8 (the 4**-bits model is not trusted further from the measured bits).
3. ``validate``: uniform against the plan on other held-out articles (``--skip``), fake-quantized the same way.

The plan is written to kvengine/q4_plans.json under the model's weights fingerprint: a plan is for those weights
only (bit_plan gives any other model format 6's uniform bits).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/results/kveval-q4/calibrate_q4.py --squad-file /tmp/squad.json \
        measure --kind k --out bench/results/kveval-q4/sensitivity_k.json      # and --kind v (two processes)
    PYTHONPATH=. .venv/bin/python bench/results/kveval-q4/calibrate_q4.py allocate \
        --sensitivities bench/results/kveval-q4/sensitivity_k.json bench/results/kveval-q4/sensitivity_v.json
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/results/kveval-q4/calibrate_q4.py --squad-file /tmp/squad.json \
        --skip 24 validate --out bench/results/kveval-q4/validate_skip24.json   # and --skip 28
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import tune_q4  # noqa: E402  (this directory's fake quantizer)

import kvengine.payload as payload  # noqa: E402
import kvengine.quant as quant  # noqa: E402
from bench.tuning import divergence, f32_references  # noqa: E402

# (kind, layer, head or None: all its heads) -> tune_q4.fake kwargs; what is not named stays exact (heads_q4.py names heads)
SPEC: dict[tuple[str, int, int | None], dict] = {}
UNIFORM = {kind: quant.AXIS_BITS[("q4", axis)] for kind, axis in quant.KINDS.items()}  # format 6's bits
LOWEST = {"k": 3, "v": 3}


def _fake_kwargs(kind: str, bits: int) -> dict:
    return dict(bits=bits, group=quant.Q4_GROUP_SIZE, int_zero=quant.INT_ZERO[("q4", quant.KINDS[kind])])


def quantize_layers(keys, values, q, *, exact=quant.EXACT_PREFIX_TOKENS, plan=None):
    """payload.quantize_layers' stand-in: each layer's kind as SPEC says, stored already dequantized."""
    out = {}
    for kind, tensors in (("k", keys), ("v", values)):
        x = torch.stack(list(tensors))
        e = min(exact, x.shape[-2])
        rest = x[..., e:, :].float()
        served = rest.clone()
        for (spec_kind, layer, head), kw in SPEC.items():
            if spec_kind == kind and head is None:
                served[layer] = tune_q4.fake(rest[layer], axis=quant.KINDS[kind], **kw)
            elif spec_kind == kind:
                served[layer][:, head] = tune_q4.fake(rest[layer][:, head], axis=quant.KINDS[kind], **kw)
        out[f"{kind}.exact"] = payload.to_raw(x[..., :e, :].contiguous())
        out[f"{kind}.served"] = payload.to_raw(served.contiguous())
    return out


def dequantize_layers(stored, num_layers, q, dtype, device):
    return tuple(
        list(torch.cat([payload.from_raw(stored[f"{kind}.{part}"]).to(dtype) for part in ("exact", "served")], dim=-2).unbind(0))
        for kind in "kv"
    )


def allocate(sensitivity: dict[str, list[float]], measured_bits: dict[str, int]) -> dict[str, list[int]]:
    """Greedy bit moves between (kind, layer) units at a constant total (the module docstring's step 2)."""
    units = [(kind, layer) for kind in ("k", "v") for layer in range(len(sensitivity[kind]))]
    bits = {u: UNIFORM[u[0]] for u in units}

    def err(u: tuple[str, int], b: int) -> float:
        return sensitivity[u[0]][u[1]] * 4.0 ** (measured_bits[u[0]] - b)

    while True:
        gain, up = max((err(u, bits[u]) - err(u, bits[u] + 1), u) for u in units if bits[u] < 8)
        loss, down = min((err(u, bits[u] - 1) - err(u, bits[u]), u) for u in units if bits[u] > LOWEST[u[0]])
        if up == down or gain <= loss:
            break
        bits[up] += 1
        bits[down] -= 1
    return {kind: [bits[(kind, layer)] for layer in range(len(sensitivity[kind]))] for kind in ("k", "v")}


def _backend_and_refs(a: argparse.Namespace):
    from kvengine import make_backend

    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    payload.quantize_layers, payload.dequantize_layers = quantize_layers, dequantize_layers
    return f32, f32_references(f32, a)


def measure(a: argparse.Namespace) -> None:
    f32, refs = _backend_and_refs(a)
    bits = a.key_bits if a.kind == "k" else a.value_bits
    out = {"kind": a.kind, "bits": bits, "scopes": [(s.article, s.num_tokens) for s in refs.scopes], "questions": len(refs.refs),
           "mean_kl": []}
    for layer in range(f32.model.config.num_hidden_layers):
        SPEC.clear()
        SPEC[(a.kind, layer, None)] = _fake_kwargs(a.kind, bits)
        start = time.perf_counter()
        d, _ = divergence(f32.variant(quant="q4"), refs)
        out["mean_kl"].append(d["mean_kl"])
        print(f"{a.kind} layer {layer} at {bits} bits: mean KL {d['mean_kl']:.3e} ({time.perf_counter() - start:.0f}s)", flush=True)
    Path(a.out).write_text(json.dumps(out, indent=1))


def allocate_command(a: argparse.Namespace) -> None:
    from kvengine import make_backend

    found = {json.loads(Path(f).read_text())["kind"]: json.loads(Path(f).read_text()) for f in a.sensitivities}
    plan = allocate({k: found[k]["mean_kl"] for k in "kv"}, {k: found[k]["bits"] for k in "kv"})
    predicted = {name: sum(found[k]["mean_kl"][i] * 4.0 ** (found[k]["bits"] - b) for k in "kv" for i, b in enumerate(bits[k]))
                 for name, bits in (("uniform", {k: [UNIFORM[k]] * len(plan[k]) for k in "kv"}), ("plan", plan))}
    print("keys  ", plan["k"], "\nvalues", plan["v"], "\npredicted mean KL (additive):", {k: f"{v:.3e}" for k, v in predicted.items()})
    assert sum(plan["k"]) + sum(plan["v"]) == len(plan["k"]) * (UNIFORM["k"] + UNIFORM["v"])  # the size is format 6's
    fingerprint = make_backend("transformers", dtype="f32", device="cpu").describe().weights_fingerprint
    plans = json.loads(quant.PLANS_FILE.read_text()) if quant.PLANS_FILE.exists() else {"plans": {}}
    plans["plans"][fingerprint] = {"model": a.model_name, "k": plan["k"], "v": plan["v"], "calibrated_on": found["k"]["scopes"],
                                   "command": "bench/results/kveval-q4/calibrate_q4.py"}
    text = json.dumps(plans, indent=1)  # innermost lists on one line: a plan reads as two rows of 30 numbers
    quant.PLANS_FILE.write_text(re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text) + "\n")


def validate(a: argparse.Namespace) -> None:
    f32, refs = _backend_and_refs(a)
    num_layers = f32.model.config.num_hidden_layers
    plan = quant.bit_plan("q4", num_layers, f32.describe().weights_fingerprint)
    results = {}
    for name, bits in (("uniform (format 6)", {k: (UNIFORM[k],) * num_layers for k in "kv"}), ("plan (format 7)", plan)):
        SPEC.clear()
        SPEC.update({(kind, layer, None): _fake_kwargs(kind, b) for kind in "kv" for layer, b in enumerate(bits[kind])})
        d, _ = divergence(f32.variant(quant="q4"), refs)
        results[name] = d
        print(f"{name}: mean KL {d['mean_kl']:.3e} p95 {d['p95_kl']:.3e} top1 {100 * d['top1_per_position']:.2f}%", flush=True)
    Path(a.out).write_text(json.dumps({"scopes": [(s.article, s.num_tokens) for s in refs.scopes], "questions": len(refs.refs),
                                       "results": results}, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--squad-file", default="")
    p.add_argument("--skip", type=int, default=20, help="articles (file order) left out: the final run's")
    p.add_argument("--scopes", type=int, default=4)
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=16)
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="per-layer sensitivity of one kind")
    m.add_argument("--kind", choices=["k", "v"], required=True)
    m.add_argument("--key-bits", type=int, default=4)
    m.add_argument("--value-bits", type=int, default=3)
    m.add_argument("--out", required=True)
    al = sub.add_parser("allocate", help="the plan from both kinds' sensitivities, into kvengine/q4_plans.json")
    al.add_argument("--sensitivities", nargs=2, required=True)
    al.add_argument("--model-name", default="smollm2-135m-instruct")
    v = sub.add_parser("validate", help="uniform against the plan on held-out articles")
    v.add_argument("--out", required=True)
    a = p.parse_args()
    {"measure": measure, "allocate": allocate_command, "validate": validate}[a.command](a)


if __name__ == "__main__":
    main()
