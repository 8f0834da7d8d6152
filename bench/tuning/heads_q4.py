"""Each (layer, KV head)'s q4 sensitivity: what the per-head plan is allocated from (calibrate_q4.py allocate).

One head of one layer quantized alone (keys at 4 bits or values at 3, tune_q4.fake), everything else exact, on
calibrate_q4.py's scopes (articles 21-24): sensitivity_heads_{k,v}.json. Per head, the sums match the per-layer
figures (sensitivity_{k,v}.json) within 14%. With the same additive model and total bits as calibrate_q4.py's
allocate, a per-head plan was predicted 1.55x below the per-layer plan; on held-out articles it measured 1.13-1.24x
(calibrate_q4.py validate, validate_heads_skip{24,28}.json).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/tuning/heads_q4.py --squad-file /tmp/squad.json \\
        --kind k --out bench/results/kveval-q4/sensitivity_heads_k.json     # and --kind v
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.tuning import calibrate_q4, divergence  # calibrate_q4: the fake-quantizing stand-ins and references


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--squad-file", required=True)
    p.add_argument("--skip", type=int, default=20)
    p.add_argument("--scopes", type=int, default=4)
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--kind", choices=["k", "v"], required=True)
    p.add_argument("--layers", default="", help="comma-separated layers (default: all)")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    f32, refs = calibrate_q4._backend_and_refs(a)
    bits = 4 if a.kind == "k" else 3
    layers = [int(x) for x in a.layers.split(",")] if a.layers else range(f32.model.config.num_hidden_layers)
    heads = f32.kv_shape[0]
    res = {}
    for layer in layers:
        for head in range(heads):
            calibrate_q4.SPEC.clear()
            calibrate_q4.SPEC[(a.kind, layer, head)] = calibrate_q4._fake_kwargs(a.kind, bits)
            d, _ = divergence(f32.variant(quant="q4"), refs)
            res[f"{layer},{head}"] = d["mean_kl"]
            print(a.kind, layer, head, f"{d['mean_kl']:.3e}", flush=True)
            Path(a.out).write_text(json.dumps({"kind": a.kind, "bits": bits, "scopes": [[s.article, s.num_tokens] for s in refs.scopes],
                                               "questions": len(refs.refs), "mean_kl_by_layer_head": res}, indent=1))


if __name__ == "__main__":
    main()
