#!/usr/bin/env python
"""Where a decoding step's time goes, eager and compiled (kvengine.compiled): torch.profiler's per-op tables side by side.

The default model (SmolLM2-135M-Instruct, f32, CPU) takes single-token steps over a random KV state of
``--context`` positions (bench/decode_step_compiled.py's random_state), first eager, then through the compiled
step (``torch.compile(model.forward, dynamic=True, fullgraph=True)``, warmed up first). Each is timed without the
profiler (median of ``--steps``) and then profiled (CPU activity): the ops' self time summed by kind (matrix
products, attention, the compiled graph's own code, dynamo's guards and wrappers, the rest) and the 15 costliest
ops.

    OMP_NUM_THREADS=2 .venv/bin/python bench/compiled_step_profile.py --context 8192 --out-dir bench/results

Writes compiled_step_profile.json (the numbers) and compiled_step_profile.txt (the tables) under --out-dir.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_step_compiled import random_state, step_times  # noqa: E402
from kv_speed import machine_info  # noqa: E402

from kvengine import make_backend  # noqa: E402
from kvengine.compiled import compiled_step, warm_up  # noqa: E402

KINDS = {"matrix products": ("aten::mm", "aten::addmm", "aten::linear", "aten::bmm"),
         "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention")}


def kind_of(name: str) -> str:
    for kind, names in KINDS.items():
        if name in names:
            return kind
    if name.startswith("## Call CompiledFxGraph"):
        return "the compiled graph's own code (its fused kernels)"
    if name in ("TorchDynamo Cache Lookup", "Pregraph bytecode") or name.startswith(("Torch-Compiled Region", "AOTDispatcher")):
        return "dynamo's guards and wrappers"
    return "other ops"


def profiled(forward, state, steps: int) -> tuple[dict, str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        step_times(forward, state, steps=steps)
        wall_ms = (time.perf_counter() - started) * 1e3 / steps
    events = prof.key_averages()
    by_kind: dict[str, float] = {}
    for event in events:
        by_kind[kind_of(event.key)] = by_kind.get(kind_of(event.key), 0.0) + event.self_cpu_time_total / 1e3 / steps
    numbers = {"profiled_wall_ms": round(wall_ms, 1), "op_self_ms_by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items())},
               "op_self_ms": round(sum(by_kind.values()), 1)}
    return numbers, events.table(sort_by="self_cpu_time_total", row_limit=15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, default=8192, help="positions of the random KV state")
    parser.add_argument("--steps", type=int, default=20, help="steps timed, and steps profiled")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--out-dir", default="bench/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", dtype="f32", quant="none", device="cpu")
    model = backend.model
    step = compiled_step(model)
    compile_s = warm_up(step, model, backend.kv_shape, dtype=backend.torch_dtype, device="cpu")
    state = random_state(backend, args.context)
    results = {"context": args.context, "steps": args.steps, "threads": torch.get_num_threads(), "compile_s": round(compile_s, 1),
               "loadavg_before": [round(x, 2) for x in os.getloadavg()], "machine": machine_info(),
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    tables = []
    for name, forward in (("eager", model), ("compiled", step)):
        step_times(forward, state, steps=3)  # warm
        results[name] = {"step_ms": round(statistics.median(step_times(forward, state, steps=args.steps)) * 1e3, 1)}
        numbers, table = profiled(forward, state, args.steps)
        results[name].update(numbers)
        tables += [f"== {name}: {json.dumps(results[name])}", table]
    results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compiled_step_profile.json").write_text(json.dumps(results, indent=1) + "\n")
    command = "OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "?") + " python bench/compiled_step_profile.py " + " ".join(argv or sys.argv[1:])
    (out / "compiled_step_profile.txt").write_text("\n".join([f"command: {command}", json.dumps(results), "", *tables]) + "\n")
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
