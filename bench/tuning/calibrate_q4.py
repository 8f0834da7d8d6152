"""Calibrate q4's bits per layer or per KV head by the teacher-forced divergence on SQuAD scopes the final run
never sees, and write the plan to kvengine/q4_plans.json under the model's weights fingerprint.

1. ``measure``: each layer's kind (keys at ``--key-bits``, values at ``--value-bits``) fake-quantized alone
   (tune_q4.fake), every other layer exact: the mean KL per position of f32's greedy answers, teacher-forced,
   is the layer's sensitivity at those bits (heads_q4.py does the same per KV head).
2. ``allocate``: a unit's divergence modelled as ``s * 4**(bits_measured - bits)``; starting from the uniform
   bits, single bits move from the unit that loses least to the one that gains most while that lowers the sum,
   the total bits (so the size) kept; bits stay in ``--lowest``..8.
3. ``validate``: uniform against each ``--plan`` on other held-out articles (``--skip``).
Why and the figures: docs/design/quantization.md ("Calibrated plans").

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/tuning/calibrate_q4.py --squad-file /tmp/squad.json \
        measure --kind k --out bench/results/kveval-q4/sensitivity_k.json      # and --kind v (two processes)
    PYTHONPATH=. .venv/bin/python bench/tuning/calibrate_q4.py allocate --sensitivities SENS_K.json SENS_V.json
"""
from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch

import kvengine.payload as payload
import kvengine.quant as quant
from bench.tuning import divergence, f32_references, tune_q4  # tune_q4: the fake quantizer

# (kind, layer, head or None: all its heads) -> tune_q4.fake kwargs; what is not named stays exact (heads_q4.py names heads)
SPEC: dict[tuple[str, int, int | None], dict] = {}
UNIFORM = {kind: quant.AXIS_BITS[("q4", axis)] for kind, axis in quant.KINDS.items()}  # every head's bits without a plan
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


Unit = tuple[str, int, "int | None"]  # (kind, layer, KV head or None: the whole layer)


def allocate(sensitivity: dict[Unit, float], measured_bits: dict[str, int], lowest: dict[str, int] = LOWEST) -> dict[Unit, int]:
    """Greedy bit moves between units (a layer's keys or values, or one head's) at a constant total (step 2)."""
    bits = {u: UNIFORM[u[0]] for u in sensitivity}

    def err(u: Unit, b: int) -> float:
        return sensitivity[u] * 4.0 ** (measured_bits[u[0]] - b)

    while True:
        gain, up = max((err(u, bits[u]) - err(u, bits[u] + 1), u) for u in bits if bits[u] < 8)
        loss, down = min((err(u, bits[u] - 1) - err(u, bits[u]), u) for u in bits if bits[u] > lowest[u[0]])
        if up == down or gain <= loss:
            break
        bits[up] += 1
        bits[down] -= 1
    return bits


def predicted(sensitivity: dict[Unit, float], measured_bits: dict[str, int], bits: dict[Unit, int]) -> float:
    """The additive model's mean KL of ``bits``."""
    return sum(s * 4.0 ** (measured_bits[u[0]] - bits[u]) for u, s in sensitivity.items())


def load_sensitivities(files: list[str]) -> tuple[dict[Unit, float], dict[str, int]]:
    """measure's (per layer) or heads_q4.py's (per head) JSON files, one per kind: sensitivity per unit, measured bits."""
    sens: dict[Unit, float] = {}
    measured: dict[str, int] = {}
    for f in files:
        found = json.loads(Path(f).read_text())
        kind = found["kind"]
        measured[kind] = found["bits"]
        if "mean_kl_by_layer_head" in found:
            for key, s in found["mean_kl_by_layer_head"].items():
                layer, head = (int(x) for x in key.split(","))
                sens[(kind, layer, head)] = s
        else:
            sens.update({(kind, layer, None): s for layer, s in enumerate(found["mean_kl"])})
    if len({u[2] is None for u in sens}) > 1:
        raise SystemExit("give both kinds per layer (measure) or both per head (heads_q4.py), not one of each")
    return sens, measured


def as_plan(bits: dict[Unit, int]) -> dict[str, list]:
    """Units' bits as q4_plans.json holds them: per kind, a list by layer of ints (per layer) or of lists by head."""
    plan: dict[str, list] = {}
    for kind in ("k", "v"):
        layers = sorted({u[1] for u in bits if u[0] == kind})
        per_head = any(u[2] is not None for u in bits)
        plan[kind] = [[b for (k, layer, head), b in sorted(bits.items(), key=lambda x: x[0][2]) if k == kind and layer == i]
                      if per_head else bits[(kind, i, None)] for i in layers]
    return plan


def spec_of(bits: dict[Unit, int]) -> dict[Unit, dict]:
    """SPEC entries that fake-quantize every unit at its bits."""
    return {u: _fake_kwargs(u[0], b) for u, b in bits.items()}


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

    sens, measured = load_sensitivities(a.sensitivities)
    bits = allocate(sens, measured, {k: a.lowest for k in "kv"})
    uniform = {u: UNIFORM[u[0]] for u in sens}
    plan = as_plan(bits)
    print("keys  ", plan["k"], "\nvalues", plan["v"], "\npredicted mean KL (additive):",
          {name: f"{predicted(sens, measured, b):.3e}" for name, b in (("uniform", uniform), ("plan", bits))})
    assert sum(bits.values()) == sum(uniform.values())  # the size is the uniform plan's
    fingerprint = make_backend("transformers", dtype="f32", device="cpu").describe().weights_fingerprint
    plans = json.loads(quant.PLANS_FILE.read_text()) if quant.PLANS_FILE.exists() else {"plans": {}}
    plans["plans"][fingerprint] = {"model": a.model_name, "k": plan["k"], "v": plan["v"], "calibrated_on": json.loads(Path(a.sensitivities[0]).read_text())["scopes"],
                                   "lowest_bits": a.lowest, "command": "bench/tuning/calibrate_q4.py"}
    text = json.dumps(plans, indent=1)  # innermost lists on one line
    quant.PLANS_FILE.write_text(re.sub(r"\[\s+([^\[\]]*?)\s+\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text) + "\n")


def validate(a: argparse.Namespace) -> None:
    """Fake-quantized, on held-out articles: uniform bits, then each ``--plan`` (sensitivity files -> allocate)."""
    f32, refs = _backend_and_refs(a)
    num_layers, heads = f32.model.config.num_hidden_layers, f32.kv_shape[0]
    candidates = {"uniform": {(k, layer, None): UNIFORM[k] for k in "kv" for layer in range(num_layers)}}
    for spec in a.plan:  # NAME=LOWEST:FILE_K,FILE_V
        name, rest = spec.split("=", 1)
        lowest, files = rest.split(":", 1)
        sens, measured = load_sensitivities(files.split(","))
        candidates[name] = allocate(sens, measured, {k: int(lowest) for k in "kv"})
        print(name, as_plan(candidates[name]), f"predicted {predicted(sens, measured, candidates[name]):.3e}", flush=True)
    results = {}
    for name, bits in candidates.items():
        assert sum(b * (1 if u[2] is not None else heads) for u, b in bits.items()) == num_layers * heads * sum(UNIFORM.values())
        SPEC.clear()
        SPEC.update(spec_of(bits))
        d, _ = divergence(f32.variant(quant="q4"), refs)
        results[name] = {**d, "plan": as_plan(bits)}
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
    al.add_argument("--lowest", type=int, default=3, help="the fewest bits a unit may get")
    v = sub.add_parser("validate", help="uniform against the plan on held-out articles")
    v.add_argument("--out", required=True)
    v.add_argument("--plan", action="append", default=[], help="NAME=LOWEST:SENS_K.json,SENS_V.json (per layer or per head)")
    a = p.parse_args()
    {"measure": measure, "allocate": allocate_command, "validate": validate}[a.command](a)


if __name__ == "__main__":
    main()
