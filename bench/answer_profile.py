#!/usr/bin/env python
"""Where an answer's time goes: torch.profiler on the first token from an ~8k cartridge and on single decoding steps.

The default model (SmolLM2-135M-Instruct, f32, CPU) compiles a cartridge of about ``--tokens`` tokens of
synthetic facts (bench/kv_speed.py's memories_for), then answers a short question exactly as a lone question is
served (the batcher's solo path, TransformersKvBackend._greedy_tokens): (1) the first token, the question's
prefill over the cached state; (2) ``--steps`` single decoding steps after it.

Each is profiled (CPU activity, record_shapes=True) with a range around every decoder layer, the final norm, the
LM head, the embedding and the rotary embedding, and around each call of kvengine.fused's kernels (ctypes calls,
unseen otherwise: ``mnesio::decode_attention``, ``mnesio::linear_rows``): a per-op table (self CPU time), a
per-layer table, and the "Python overhead" (profiled wall time minus the ops' self time); the same passes are also
timed unprofiled (median of ``--repeats``), beside the batched answer(). ``--pass native`` (default): the product's
passes, the decoder's layers in one library call (kvengine.native_pass: one range, ``mnesio::layers_pass``; no
module ranges, as a forward hook sends the pass to the model); ``--pass model``: the model's forward op by op.

    OMP_NUM_THREADS=2 .venv/bin/python bench/answer_profile.py --tokens 8000 --out-dir bench/results
    OMP_NUM_THREADS=2 .venv/bin/python bench/answer_profile.py --tokens 8000 --pass model --out-dir bench/results/per_op

Writes answer_profile.txt (the report with the tables) and answer_profile.json (numbers only) under --out-dir.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kv_speed import machine_info, memories_for, probes  # noqa: E402

from kvengine import fused, make_backend, native_pass  # noqa: E402
from kvengine.kvcache import CartridgeCache  # noqa: E402

FIRST_RANGE, STEP_RANGE = "answer.first_token", "answer.decode_step"
# the kernels' calls, by kind: torch's ops and kvengine.fused's (ctypes calls, which the profiler sees only in a range)
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "mnesio::decode_attention")
LINEAR_OPS = ("aten::mm", "aten::addmm", "aten::_weight_int8pack_mm", "mnesio::linear_rows")
LAYERS_OP = "mnesio::layers_pass"  # kvengine.native_pass's library call: every decoder layer, attention and products


@contextlib.contextmanager
def fused_ranges():
    """A record_function range around each call of kvengine.fused's kernels, so the profile counts them as ops."""
    saved = fused.decode_attention, fused.linear_rows
    lib = fused.kernel()
    layers = lib.mnesio_layers_pass if lib is not None else None

    def ranged(name, kernel):
        def call(*args):
            with record_function(name):
                return kernel(*args)
        return call

    fused.decode_attention = ranged("mnesio::decode_attention", saved[0])
    fused.linear_rows = ranged("mnesio::linear_rows", saved[1])
    if layers is not None:
        lib.mnesio_layers_pass = ranged(LAYERS_OP, layers)
    try:
        yield
    finally:
        fused.decode_attention, fused.linear_rows = saved
        if layers is not None:
            lib.mnesio_layers_pass = layers


def add_ranges(model: torch.nn.Module) -> tuple[list[str], list]:
    """A record_function range around each decoder layer, the final norm, the LM head, the embedding and rotary
    embedding (entered by a forward pre-hook, left by a forward hook); returns the range names and the handles."""
    base = model.model
    modules = [("embed_tokens", base.embed_tokens), ("rotary_emb", base.rotary_emb)]
    modules += [(f"layer.{i}", layer) for i, layer in enumerate(base.layers)]
    modules += [("norm", base.norm), ("lm_head", model.lm_head)]
    handles = []
    for name, module in modules:
        stack: list = []

        def enter(_module, _args, _name=name, _stack=stack):
            ctx = record_function(_name)
            ctx.__enter__()
            _stack.append(ctx)

        def leave(_module, _args, _output, _stack=stack):
            _stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    return [name for name, _ in modules], handles


class Passes:
    """The lone-question passes over one cartridge's scratch tail (what the batcher's solo path runs)."""

    def __init__(self, backend, cartridge, question: str, steps: int, *, native: bool):
        self.backend = backend
        # the product's passes (the decoder's pass in one call, kvengine.native_pass) or the model's own forward
        self.model, self.step_forward = (backend._prompt_pass, backend._decode_step) if native else (backend.model, backend.model)
        self.state = backend._payload(cartridge).state
        layout = backend.layout
        self.suffix = layout.encode(layout.suffix_text(layout.clean_question(question)))
        self.steps = steps

    @contextlib.contextmanager
    def cache(self):
        with self.state.scratch(), torch.inference_mode():
            self.state.ensure_capacity(self.state.num_tokens + len(self.suffix) + self.steps + 1)
            cache = CartridgeCache(self.state)
            try:
                yield cache
            finally:
                cache.crop_back()

    def first(self, cache, *, label: bool = False) -> int:
        with record_function(FIRST_RANGE) if label else contextlib.nullcontext():
            input_ids = torch.tensor([self.suffix], device=self.backend.device)
            logits = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1].float()
            return int(logits.argmax())

    def step(self, cache, token: int, *, label: bool = False) -> int:
        with record_function(STEP_RANGE) if label else contextlib.nullcontext():
            input_ids = torch.tensor([[token]], device=self.backend.device)
            logits = self.step_forward(input_ids=input_ids, cache=cache, use_cache=True).logits[0, -1].float()
            return int(logits.argmax())

    def timed(self, repeats: int) -> dict[str, float]:
        """Median first-token and per-step seconds, no profiler (each repeat: first token, then ``steps`` steps)."""
        firsts, steps = [], []
        for _ in range(repeats):
            with self.cache() as cache:
                started = time.perf_counter()
                token = self.first(cache)
                firsts.append(time.perf_counter() - started)
                for _ in range(self.steps):
                    started = time.perf_counter()
                    token = self.step(cache, token)
                    steps.append(time.perf_counter() - started)
        return {"first_token_ms": statistics.median(firsts) * 1e3, "decode_step_ms": statistics.median(steps) * 1e3,
                "first_token_min_ms": min(firsts) * 1e3, "decode_step_min_ms": min(steps) * 1e3}


def split(prof, names: list[str], wall_s: float, count: int, outer: str) -> dict:
    """Per-range and per-op numbers of one profile: wall, op self time, Python overhead, each range's share."""
    events = prof.key_averages()
    ours = set(names) | {FIRST_RANGE, STEP_RANGE}
    ops = [e for e in events if e.key not in ours]
    op_self_us = sum(e.self_cpu_time_total for e in ops)
    by_key = {e.key: e for e in events}
    outer_us = by_key[outer].cpu_time_total if outer in by_key else float("nan")
    ranges = {}
    for name in names:
        e = by_key.get(name)
        if e is None:
            continue
        ranges[name] = {"calls": e.count, "total_ms": e.cpu_time_total / 1e3 / count, "python_ms": e.self_cpu_time_total / 1e3 / count,
                        "ops_ms": (e.cpu_time_total - e.self_cpu_time_total) / 1e3 / count}
    layers = [v for k, v in ranges.items() if k.startswith("layer.")]
    top = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    return {
        "passes": count,
        "wall_ms": wall_s * 1e3 / count,
        "profiled_range_ms": outer_us / 1e3 / count,
        "op_self_ms": op_self_us / 1e3 / count,
        "python_overhead_ms": (wall_s * 1e6 - op_self_us) / 1e3 / count,
        "layers_total_ms": sum(v["total_ms"] for v in layers),
        "layers_python_ms": sum(v["python_ms"] for v in layers),
        "outside_layers_ms": (outer_us / count - sum(v["total_ms"] for v in layers) * 1e3) / 1e3,
        "ranges": ranges,
        "top_ops": [{"op": e.key, "calls": e.count / count, "self_ms": e.self_cpu_time_total / 1e3 / count} for e in top],
        "attention_ms": sum(e.self_cpu_time_total for e in ops if e.key in ATTENTION_OPS) / 1e3 / count,
        "linear_ms": sum(e.self_cpu_time_total for e in ops if e.key in LINEAR_OPS) / 1e3 / count,
        "layers_pass_ms": sum(e.self_cpu_time_total for e in ops if e.key == LAYERS_OP) / 1e3 / count,
    }


def layer_table(numbers: dict) -> str:
    rows = [f"{'range':<14}{'calls':>6}{'total ms':>10}{'in ops ms':>11}{'python ms':>11}"]
    for name, v in numbers["ranges"].items():
        rows.append(f"{name:<14}{v['calls']:>6}{v['total_ms']:>10.2f}{v['ops_ms']:>11.2f}{v['python_ms']:>11.2f}")
    rows.append(f"{'layers, sum':<14}{'':>6}{numbers['layers_total_ms']:>10.2f}{numbers['layers_total_ms'] - numbers['layers_python_ms']:>11.2f}"
                f"{numbers['layers_python_ms']:>11.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000, help="cartridge size in tokens (the longest prefix of the facts that fits)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--steps", type=int, default=8, help="decoding steps after the first token, profiled and timed")
    parser.add_argument("--repeats", type=int, default=7, help="untimed-profiler repeats (median)")
    parser.add_argument("--profile-repeats", type=int, default=3, help="first-token passes under the profiler (averaged)")
    parser.add_argument("--out-dir", default="bench/results")
    parser.add_argument("--model", default=None, help="model id (default: the backend's)")
    parser.add_argument("--pass", dest="passes", choices=("native", "model"), default="native",
                        help="native: the product's passes (the decoder's layers in one library call); model: the model's own forward, op by op")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    started_run = time.time()
    backend = make_backend("transformers", dtype="f32", quant="none", device="cpu", **({"model": args.model} if args.model else {}))
    texts = memories_for(backend, args.tokens)
    question = probes(len(texts), 1)[0][0]
    backend.compile(texts[:3])  # warm up
    started = time.perf_counter()
    cartridge = backend.compile(texts)
    compile_s = time.perf_counter() - started
    native_pass.ENABLED = args.passes == "native"  # --pass model: answer() below runs the model's forward too
    passes = Passes(backend, cartridge, question, args.steps, native=native_pass.ENABLED)
    for _ in range(2):  # warm up the passes themselves
        passes.timed(1)
    plain = passes.timed(args.repeats)
    answers = [backend.answer(cartridge, question, max_new_tokens=args.steps + 1, stop_at_eos=False) for _ in range(args.repeats)]
    batched = {"first_token_ms": statistics.median(a.ttft_s for a in answers) * 1e3,
               "decode_step_ms": statistics.median((a.total_s - a.ttft_s) / args.steps for a in answers) * 1e3}
    answer_text = answers[0].text

    # a module hook sends the one-call pass to the model's forward (kvengine.native_pass): the native passes get the
    # kernels' ranges only, the library call among them
    names, handles = add_ranges(backend.model) if not native_pass.ENABLED else ([], [])
    kernel_ranges = fused_ranges()
    kernel_ranges.__enter__()  # left in the finally below, with the layers' ranges
    try:
        hooked = passes.timed(args.repeats)  # the ranges' own cost, still without a profiler
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof_first:
            wall = 0.0
            for _ in range(args.profile_repeats):
                with passes.cache() as cache:
                    t0 = time.perf_counter()
                    passes.first(cache, label=True)
                    wall += time.perf_counter() - t0
        first = split(prof_first, names, wall, args.profile_repeats, FIRST_RANGE)
        with passes.cache() as cache:
            token = passes.first(cache)
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof_step:
                wall = 0.0
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    token = passes.step(cache, token, label=True)
                    wall += time.perf_counter() - t0
        step = split(prof_step, names, wall, args.steps, STEP_RANGE)
        if native_pass.ENABLED and not (first["layers_pass_ms"] > 0 and step["layers_pass_ms"] > 0):
            raise SystemExit("the one-call pass did not run under the profiler: the native profile would be the model's")
    finally:
        kernel_ranges.__exit__(None, None, None)
        for handle in handles:
            handle.remove()
    plain_after = passes.timed(args.repeats)  # again after the profiles: the machine's load may have moved meanwhile
    load_after = os.getloadavg()

    config = backend.model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in backend.model.parameters())
    kv_per_token = 2 * config.num_hidden_layers * backend.kv_shape[0] * backend.kv_shape[1] * 4
    results = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_run)), "cpu": machine_info()["cpu"],
        "tokens": cartridge.header.num_tokens, "question_tokens": len(passes.suffix), "steps": args.steps, "threads": torch.get_num_threads(),
        "passes": args.passes, "repeats": args.repeats, "profile_repeats": args.profile_repeats, "compile_s": compile_s,
        "loadavg_before": list(load_before), "loadavg_after": list(load_after), "run_s": time.time() - started_run,
        "weights_mb": weight_bytes / 1e6, "kv_bytes_per_token": kv_per_token, "kv_mb": kv_per_token * cartridge.header.num_tokens / 1e6,
        "plain": plain, "plain_after": plain_after, "with_ranges": hooked, "batched_answer": batched,
        "first_token": first, "decode_step": step,
    }
    info = machine_info()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "answer_profile.json").write_text(json.dumps(results, indent=2) + "\n")

    command = "OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "?") + " python bench/answer_profile.py " + " ".join(argv or sys.argv[1:])
    lines = [
        f"command: {command}",
        f"machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, transformers {info['transformers']}, "
        f"python {platform.python_version()}, {torch.get_num_threads()} torch threads, CPU capability {torch.backends.cpu.get_cpu_capability()}",
        f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; after: {', '.join(f'{x:.2f}' for x in load_after)}",
        f"cartridge: {cartridge.header.num_tokens} tokens of {len(texts)} facts, compiled in {compile_s:.1f} s; "
        f"question {question!r} ({len(passes.suffix)} tokens); answer {answer_text!r}",
        f"weights {weight_bytes / 1e6:.0f} MB f32; KV {kv_per_token / 1e3:.1f} KB/token, {results['kv_mb']:.0f} MB for the cartridge",
        "",
        f"without the profiler (median of {args.repeats}; min in brackets):",
        f"  first token  {plain['first_token_ms']:.1f} ms ({plain['first_token_min_ms']:.1f}), "
        f"decode step {plain['decode_step_ms']:.1f} ms ({plain['decode_step_min_ms']:.1f})",
        f"  again after the profiles: first token {plain_after['first_token_ms']:.1f} ms, decode step {plain_after['decode_step_ms']:.1f} ms",
        f"  with the record_function ranges (no profiler): first token {hooked['first_token_ms']:.1f} ms, decode step {hooked['decode_step_ms']:.1f} ms",
        f"  the product's batched answer(): first token {batched['first_token_ms']:.1f} ms, per token after it {batched['decode_step_ms']:.1f} ms",
    ]
    for title, numbers, prof in (("FIRST TOKEN", first, prof_first), ("DECODE STEP", step, prof_step)):
        lines += [
            "", "=" * 100,
            f"{title} under the profiler (per pass, over {numbers['passes']} passes): wall {numbers['wall_ms']:.1f} ms, "
            f"summed op self time {numbers['op_self_ms']:.1f} ms, Python overhead (wall - ops) {numbers['python_overhead_ms']:.1f} ms",
            f"  decoder layers {numbers['layers_total_ms']:.1f} ms (of it Python between ops {numbers['layers_python_ms']:.1f} ms); "
            f"outside the layers (embedding, rotary, norm, LM head, model glue) {numbers['outside_layers_ms']:.1f} ms",
            f"  the decoder's layers in one library call ({LAYERS_OP}) {numbers['layers_pass_ms']:.1f} ms; "
            f"attention {numbers['attention_ms']:.1f} ms and linear layers {numbers['linear_ms']:.1f} ms outside it",
            "", "per range (ms per pass):", layer_table(numbers), "",
            "per op (totals over all passes):",
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25),
            "per op and input shape (totals over all passes):",
            prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=15),
        ]
    (out / "answer_profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    print(f"first token: wall {first['wall_ms']:.1f} ms, ops {first['op_self_ms']:.1f} ms, layers {first['layers_total_ms']:.1f} ms; "
          f"decode step: wall {step['wall_ms']:.1f} ms, ops {step['op_self_ms']:.1f} ms, layers {step['layers_total_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
