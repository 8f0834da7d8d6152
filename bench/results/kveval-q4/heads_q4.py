"""Exploratory (not used by the engine): each (layer, KV head)'s q4 sensitivity, for a per-head plan later.

One head of one layer quantized alone (keys at 4 bits or values at 3, tune_q4.fake), everything else exact, on
calibrate_q4.py's scopes (articles 21-24): sensitivity_heads_{k,v}.json. Per head, the sums match the per-layer
figures (sensitivity_{k,v}.json) within 14%. With the same additive model and total bits as calibrate_q4.py's
allocate, a per-head plan is predicted 1.5x below the per-layer plan (not measured; see BENCHMARKS.md).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/results/kveval-q4/heads_q4.py --squad-file /tmp/squad.json \\
        --kind k --out bench/results/kveval-q4/sensitivity_heads_k.json     # and --kind v
"""
import json
import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import tune_q4 as T

import kvengine.payload as payload
import kvengine.quant as quant
from bench.tuning import divergence, f32_references, parser
from kvengine import make_backend

SPEC = {}

def quantize_layers(keys, values, q, *, exact=quant.EXACT_PREFIX_TOKENS, plan=None):
    out = {}
    for kind, t in (("k", keys), ("v", values)):
        x = torch.stack(list(t))
        e = min(exact, x.shape[-2])
        rest = x[..., e:, :].float()
        served = rest.clone()
        for (k2, layer, head), kw in SPEC.items():
            if k2 == kind:
                served[layer][:, head] = T.fake(rest[layer][:, head], axis=quant.KINDS[kind], **kw)
        out[f"{kind}.exact"] = payload.to_raw(x[..., :e, :].contiguous())
        out[f"{kind}.served"] = payload.to_raw(served.contiguous())
    return out

def dequantize_layers(stored, num_layers, q, dtype, device):
    return tuple(list(torch.cat([payload.from_raw(stored[f"{k}.{p}"]).to(dtype) for p in ("exact", "served")], dim=-2).unbind(0)) for k in "kv")

payload.quantize_layers, payload.dequantize_layers = quantize_layers, dequantize_layers

def main():
    p = parser(scopes=4, questions=48, only_sep=";")
    p.add_argument("--kind", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    refs = f32_references(f32, a)
    bits = 4 if a.kind == "k" else 3
    res = {}
    for layer in range(30):
        for head in range(3):
            SPEC.clear()
            SPEC[(a.kind, layer, head)] = dict(bits=bits, group=64, int_zero=(a.kind == "v"))
            d, _ = divergence(f32.variant(quant="q4"), refs)
            res[f"{layer},{head}"] = d["mean_kl"]
            print(a.kind, layer, head, f"{d['mean_kl']:.3e}", flush=True)
            json.dump(res, open(a.out, "w"))

main()
