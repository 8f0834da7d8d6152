#!/usr/bin/env python
"""The decoding step eager and compiled (kvengine.compiled: torch.compile, inductor), side by side, and whether the
compiled step answers as eager does.

Timing: for each ``--dtypes`` backend, the step compiled once (warm_up: its seconds are the compile's, cold in a new
``--inductor-cache``; then again in a second process, warm from that cache), then at each ``--contexts`` length eager and
compiled single-token steps over a random KV state, interleaved (medians of ``--steps``), the load average checked
first (waiting up to ``--quiet-wait`` s for it to fall under 1.5). Recompiles: graphs compiled while decoding
token by token at each length (0 wanted). Agreement (``--questions``): LoCoMo development scopes (evaluation
only) at each ``--scope-tokens``: greedy tokens of the eager and the compiled cartridge path, and of the compiled
path's cartridge and re-reading; and the largest difference of one step's logits, compiled against eager.

    OMP_NUM_THREADS=2 .venv/bin/python bench/decode_step_compiled.py --questions 4 --out bench/results/decode_step_compiled.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def quiet(max_wait_s: float) -> dict:
    """Wait (up to ``max_wait_s``) for the 1-minute load average to fall under 1.5; say what it was."""
    waited, started = 0.0, time.monotonic()
    while os.getloadavg()[0] > 1.5 and waited < max_wait_s:
        time.sleep(10)
        waited = time.monotonic() - started
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "waited_s": round(waited)}


def busy_cpus(seconds: float = 1.0) -> float:
    """CPUs' worth of work the machine did over the last ``seconds`` (from /proc/stat; this process idle meanwhile)."""
    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    (total0, idle0), _ = sample(), time.sleep(seconds)
    total1, idle1 = sample()
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / max(1, total1 - total0))


def idle_enough(max_wait_s: float, most_busy: float = 0.2) -> float:
    """Wait (up to ``max_wait_s``) until other work uses under ``most_busy`` CPUs; return what it used last."""
    started = time.monotonic()
    while (busy := busy_cpus()) > most_busy and time.monotonic() - started < max_wait_s:
        pass
    return busy


def random_state(backend, n: int):
    import torch

    from kvengine.kvcache import KvState

    g = torch.Generator().manual_seed(n)
    heads, dim = backend.kv_shape
    layers = backend.model.config.get_text_config().num_hidden_layers
    with torch.inference_mode():  # as a compiled or loaded cartridge's: inference tensors (the compiled step guards on it)
        keys = [torch.randn(1, heads, n, dim, generator=g) for _ in range(layers)]
        values = [torch.randn(1, heads, n, dim, generator=g) for _ in range(layers)]
        return KvState(keys, values, room=64)


def step_times(forward, state, *, steps: int, grow: bool = False) -> list[float]:
    """Seconds of ``steps`` single-token steps over ``state`` (cropped back after each unless ``grow``)."""
    import torch

    from kvengine.kvcache import CartridgeCache

    times, cache = [], CartridgeCache(state)
    with torch.inference_mode():
        for i in range(steps):
            started = time.perf_counter()
            int(forward(input_ids=torch.tensor([[1000 + i]]), cache=cache, use_cache=True).logits[0, -1].argmax())
            times.append(time.perf_counter() - started)
            if not grow:
                cache.crop_back()
    cache.crop_back()
    return times


def logit_diff(model, step, state) -> float:
    """The largest difference between one step's logits eager and compiled over the same state."""
    import torch

    from kvengine.kvcache import CartridgeCache

    logits = []
    with torch.inference_mode():
        for forward in (model, step):
            cache = CartridgeCache(state)
            logits.append(forward(input_ids=torch.tensor([[1000]]), cache=cache, use_cache=True).logits[0, -1])
            cache.crop_back()
    return float((logits[0] - logits[1]).abs().max())


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def timing(backend, dtype: str, contexts: list[int], args) -> dict:
    from kvengine.compiled import compiled_step, warm_up

    model = backend.model
    step = compiled_step(model)
    compile_s = warm_up(step, model, backend.kv_shape, dtype=backend.torch_dtype, device="cpu")
    row = {"dtype": dtype, "compile_s": round(compile_s, 1), "graphs_after_warm_up": graphs()}
    for n in contexts:
        state = random_state(backend, n)
        for forward in (model, step):  # first calls at this length, not timed
            step_times(forward, state, steps=2)
        row[f"load_{n}"] = quiet(args.quiet_wait)
        eager, compiled, busy = [], [], []
        for _ in range(args.steps // 5):  # interleaved, each pair of runs after a second of an idle enough machine
            busy.append(round(idle_enough(args.quiet_wait / 4), 2))
            eager += step_times(model, state, steps=5)
            compiled += step_times(step, state, steps=5)
        row[f"busy_cpus_before_{n}"] = busy
        row[f"eager_ms_{n}"] = round(statistics.median(eager) * 1e3, 1)
        row[f"compiled_ms_{n}"] = round(statistics.median(compiled) * 1e3, 1)
        row[f"max_abs_logit_diff_{n}"] = logit_diff(model, step, state)
        before = graphs()
        step_times(step, state, steps=args.grow, grow=True)
        row[f"recompiles_growing_{n}"] = graphs() - before
        row[f"load_after_{n}"] = [round(x, 2) for x in os.getloadavg()]
        print(json.dumps(row), flush=True)
    return row


def agreement(backend, eager_backend, args) -> dict:
    from bench.decode_step_candidates import locomo_scopes

    counts = {"questions": 0, "compiled_equals_eager": 0, "compiled_cartridge_equals_re_reading": 0,
              "eager_cartridge_equals_re_reading": 0, "scopes": 0, "scope_tokens": []}
    max_diff = 0.0
    for tokens in args.scope_tokens:
        for texts, questions in locomo_scopes(eager_backend, tokens=tokens, questions=args.questions)[: args.scopes]:
            cartridge = backend.compile(texts)
            counts["scopes"] += 1
            counts["scope_tokens"].append(cartridge.header.num_tokens)
            for q in questions:
                compiled = backend.answer(cartridge, q, max_new_tokens=args.max_new_tokens).token_ids
                eager = eager_backend.answer(cartridge, q, max_new_tokens=args.max_new_tokens).token_ids
                counts["questions"] += 1
                counts["compiled_equals_eager"] += compiled == eager
                counts["compiled_cartridge_equals_re_reading"] += backend.answer_from_text(texts, q, max_new_tokens=args.max_new_tokens).token_ids == compiled
                counts["eager_cartridge_equals_re_reading"] += eager_backend.answer_from_text(texts, q, max_new_tokens=args.max_new_tokens).token_ids == eager
            max_diff = max(max_diff, logit_diff(backend.model, backend._decode_step, backend._payload(cartridge).state))
            print(json.dumps(counts), flush=True)
    counts["max_abs_logit_diff"] = max_diff
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="f32,f32w8")
    parser.add_argument("--contexts", default="2048,8192")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--grow", type=int, default=8, help="tokens decoded growing the cache, counting recompiles")
    parser.add_argument("--quiet-wait", type=float, default=60)
    parser.add_argument("--inductor-cache", default="", help="TORCHINDUCTOR_CACHE_DIR (default: a new empty folder, a cold compile)")
    parser.add_argument("--questions", type=int, default=0, help="questions per LoCoMo scope for the agreement (0: none)")
    parser.add_argument("--scopes", type=int, default=3)
    parser.add_argument("--scope-tokens", default="1000,3000")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--warm-only", action="store_true", help="only compile each dtype's step and print the seconds "
                        "(what the timing run starts in a second process, over the cache the first one filled)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    args.scope_tokens = [int(t) for t in args.scope_tokens.split(",")]
    args.inductor_cache = args.inductor_cache or tempfile.mkdtemp(prefix="inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache
    cache_was_empty = not any(Path(args.inductor_cache).glob("*"))
    import torch

    from kvengine import make_backend

    torch.set_num_threads(args.threads)
    result = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__, "threads": args.threads, "steps": args.steps, "inductor_cache": args.inductor_cache,
              "inductor_cache_was_empty": cache_was_empty, "rows": []}
    base = make_backend("transformers", dtype="f32", device="cpu")
    if args.warm_only:
        from kvengine.compiled import compiled_step, warm_up

        seconds = {}
        for dtype in args.dtypes.split(","):
            backend = base if dtype == "f32" else base.variant(dtype=dtype)
            seconds[dtype] = round(warm_up(compiled_step(backend.model), backend.model, backend.kv_shape,
                                           dtype=backend.torch_dtype, device="cpu"), 1)
        print(json.dumps(seconds))
        return 0
    contexts = [int(c) for c in args.contexts.split(",")]
    for dtype in args.dtypes.split(","):
        backend = base if dtype == "f32" else base.variant(dtype=dtype)
        if not args.no_timing:
            result["rows"].append(timing(backend, dtype, contexts, args))
        if args.questions:
            started = time.perf_counter()
            compiled = make_backend("transformers", dtype=dtype, device="cpu", compile_step=True)
            load_s = time.perf_counter() - started  # the model's load and the step's warm-up
            started = time.perf_counter()
            result.setdefault("agreement", {})[dtype] = agreement(compiled, backend, args)
            result["agreement"][dtype].update(seconds=round(time.perf_counter() - started, 1), backend_load_s=round(load_s, 1))
    if not args.no_timing:  # the compile again in a fresh process: from inductor's on-disk cache
        command = [sys.executable, __file__, "--warm-only", "--dtypes", args.dtypes, "--threads", str(args.threads)]
        warm = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ.copy())
        seconds = json.loads(warm.stdout.strip().splitlines()[-1])
        for row in result["rows"]:
            row["compile_warm_s"] = seconds[row["dtype"]]
        result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
