"""Time storing and loading one quantized 256-token block part of SmolLM2's shape (30 layers, 3 KV heads, head_dim 64).

quantize_layers is what compile pays per block, dequantize_layers what a load pays (kvengine/payload.py). Random
normal KV (keys scaled 2x); q4 uses SmolLM2's calibrated plan when this commit has one (per layer, or per KV head), else uniform bits.
It runs at any commit with block parts (kvengine/payload.py's stacked layers), so two commits can be compared
side by side in one run:

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python bench/quant_speed.py
    (cd ../a-worktree-at-another-commit && OMP_NUM_THREADS=1 PYTHONPATH=. ../main/.venv/bin/python ../main/bench/quant_speed.py)
"""
from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time

import torch

import kvengine.payload as payload
import kvengine.quant as quant

SMOLLM2_WEIGHTS = "8279458172714e4df95b8da4d38c020e01259a67c20d6ddbd20e0b228b1873e6"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--tokens", type=int, default=256)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    keys = [torch.randn(1, 3, a.tokens, 64) * 2 for _ in range(30)]
    values = [torch.randn(1, 3, a.tokens, 64) for _ in range(30)]
    has_plan = "plan" in inspect.signature(payload.quantize_layers).parameters
    heads = [3] if has_plan and "num_heads" in inspect.signature(quant.bit_plan).parameters else []  # a bit_plan per KV head
    out = {"format_version": __import__("kvengine.format", fromlist=["FORMAT_VERSION"]).FORMAT_VERSION, "tokens": a.tokens}
    for q in ("q8", "q4"):
        kw = {"plan": quant.bit_plan(q, 30, *heads, SMOLLM2_WEIGHTS)} if has_plan else {}
        stored = payload.quantize_layers(keys, values, q, exact=0, **kw)
        store_ms, load_ms = [], []
        for _ in range(a.repeats):
            start = time.perf_counter()
            stored = payload.quantize_layers(keys, values, q, exact=0, **kw)
            store_ms.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            payload.dequantize_layers(stored, 30, q, torch.float32, "cpu")
            load_ms.append((time.perf_counter() - start) * 1e3)
        out[q] = {"store_ms_median": round(statistics.median(store_ms), 2), "load_ms_median": round(statistics.median(load_ms), 2),
                  "bytes": sum(raw.num_bytes for raw in stored.values()), "plan": has_plan and q == "q4"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
