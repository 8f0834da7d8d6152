"""Tune q8's grouping by the teacher-forced divergence (kvengine.divergence) on SQuAD scopes the final run never sees.

The at-scale kveval run packs its budget-1024 scopes from the first articles of SQuAD dev in file order; this
script packs its scopes from articles further on (--skip), so the method is chosen on other data than it is
measured on. Each candidate patches kvengine.quant's GROUPS/ROTATE, compiles the q8 cartridge (block on block,
as served) and teacher-forces the f32 cartridge's greedy answers through it.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/tuning/tune_q8.py --squad-file squaddev_v1.1.json \
        --out bench/results/kveval-q8-blocks/tune_q8.json
"""
from __future__ import annotations

import json
import time

import torch

import kvengine.quant as quant
from bench.tuning import divergence, f32_references, parser
from kvengine import make_backend

CANDIDATES = {  # name -> (key group along tokens, value group along head_dim, rotate)
    "k64 v64 rot": (64, 64, True),
    "k32 v32 rot": (32, 32, True),
    "k32 v32": (32, 32, False),
    "k32 v64 rot": (32, 64, True),
    "k64 v32 rot": (64, 32, True),
    "k16 v16 rot": (16, 16, True),
}


def main() -> None:
    a = parser(scopes=4, questions=48).parse_args()
    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    refs = f32_references(f32, a)
    results = {}
    only = [n for n in a.only.split(",") if n]
    for name, (kg, vg, rot) in CANDIDATES.items():
        if only and name not in only:
            continue
        quant.GROUPS[("q8", "channel")], quant.GROUPS[("q8", "token")] = kg, vg
        quant.ROTATE[("q8", "channel")] = quant.ROTATE[("q8", "token")] = rot
        start = time.perf_counter()
        d, size = divergence(f32.variant(quant="q8"), refs)
        d["size_vs_f32"] = size
        d["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = d
        print(f"{name}: mean KL {d['mean_kl']:.3e} p95 {d['p95_kl']:.3e} max {d['max_kl']:.3e} first {d['first_token_mean_kl']:.3e} "
              f"top1 {100 * d['top1_per_position']:.2f}% ({d['num_positions']} pos) size {d['size_vs_f32']:.3f} {d['seconds']}s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"scopes": [(s.article, s.num_tokens) for s in refs.scopes], "questions": len(refs.refs), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
