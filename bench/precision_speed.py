"""Precision side by side in one run: f32, bf16, bf16r (and bf16 decoding through enable_gqa), prefill and decode speed,
plus the divergence of every precision and quantization from f32 (kvengine.divergence) on the same scope.

    OMP_NUM_THREADS=1 .venv/bin/python bench/precision_speed.py --contexts 1000,8000 --threads 1

Per context: one scope of kv_speed's synthetic facts (bench/kv_speed.py memories_for); compile per dtype
(prefill tok/s); ``--reps`` answers of ``--answer-tokens`` tokens each from the cartridge (TTFT, end-to-end,
ms per decoded token); "bf16 (enable_gqa decode)" repeats bf16 with single-token decoding routed
through transformers' sdpa with enable_gqa instead of the packed kernel, to show what the packed decode gains. Then
``--probes`` questions answered by f32 and teacher-forced through q8, q4, bf16, bf16r and bf16r with its matmul
outputs rounded to bf16 (precision.EXACT_OUTPUTS emptied): mean / p95 KL,
top-1 per position, identical answers. Results: bench/results/precision_speed.json and .md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def timed_answers(backend: Any, cartridge: Any, questions: list[str], tokens: int) -> dict[str, float]:
    runs = [backend.answer(cartridge, q, max_new_tokens=tokens, stop_at_eos=False) for q in questions]
    ttft, e2e = median([r.ttft_s for r in runs]), median([r.total_s for r in runs])
    return {"ttft_s": ttft, "e2e_s": e2e, "decode_ms_per_token": 1000 * (e2e - ttft) / max(1, tokens - 1)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from kv_speed import machine_info, memories_for, probes

    import kvengine.attention as attention
    import kvengine.precision as precision
    from kvengine import make_backend
    from kvengine.divergence import AnswerDivergence, DivergenceSummary

    if args.threads:
        torch.set_num_threads(args.threads)
    f32 = make_backend("transformers", model=args.model, dtype="f32", device="cpu")
    backends = {"f32": f32, "bf16": f32.variant(dtype="bf16"), "bf16r": f32.variant(dtype="bf16r")}
    exact = precision.EXACT_OUTPUTS  # bf16r's exact matmul outputs, beside a bf16r whose outputs are rounded
    precision.EXACT_OUTPUTS = ()
    try:
        backends["bf16r (rounded outputs)"] = f32.variant(dtype="bf16r")
    finally:
        precision.EXACT_OUTPUTS = exact
    quants = {"q8": f32.variant(quant="q8"), "q4": f32.variant(quant="q4")}
    rows = []
    for target in args.contexts:
        texts = memories_for(f32, target)
        qs = [q for q, _ in probes(len(texts), max(args.probes, args.reps))]
        row: dict[str, Any] = {"target_tokens": target}
        carts = {}
        for name, backend in backends.items():
            backend.answer(backend.compile([texts[0]]), qs[0], max_new_tokens=2)  # warm up
            start = time.perf_counter()
            carts[name] = backend.compile(texts)
            seconds = time.perf_counter() - start
            row["num_tokens"] = n = carts[name].header.num_tokens
            row[name] = {"compile_s": seconds, "prefill_tok_s": n / seconds,
                         **timed_answers(backend, carts[name], qs[: args.reps], args.answer_tokens)}
            print(target, name, row[name], flush=True)
        old_packs = attention.packs
        # single-token decode through transformers' sdpa (enable_gqa), not the packed kernel
        attention.packs = lambda module, query, mask, dropout, kwargs, old=old_packs: query.shape[2] > 1 and old(module, query, mask, dropout, kwargs)
        try:
            row["bf16 (enable_gqa decode)"] = timed_answers(backends["bf16"], carts["bf16"], qs[: args.reps], args.answer_tokens)
        finally:
            attention.packs = old_packs
        print(target, "bf16 (enable_gqa decode)", row["bf16 (enable_gqa decode)"], flush=True)
        for name, backend in quants.items():
            # a quantized cartridge is compiled block on block over its own dequantized KV, so it is no byte
            # conversion of the f32 one; the variant backend shares the f32 weights (no second load)
            start = time.perf_counter()
            carts[name] = backend.compile(texts)
            row[name] = {"compile_s": time.perf_counter() - start}
        variants = {**{k: v for k, v in backends.items() if k != "f32"}, **quants}
        answers: dict[str, list] = {name: [] for name in variants}
        for q in qs[: args.probes]:
            ref = f32.answer(carts["f32"], q, max_new_tokens=args.agree_tokens)
            ref_logp = f32.answer_logprobs(carts["f32"], q, ref.token_ids)
            for name, backend in variants.items():
                logp = backend.answer_logprobs(carts[name], q, ref.token_ids)
                same = backend.answer(carts[name], q, max_new_tokens=args.agree_tokens).token_ids == ref.token_ids
                answers[name].append(AnswerDivergence.of(ref_logp, logp, identical=same))
        row["divergence"] = {name: DivergenceSummary.of(a).as_dict() for name, a in answers.items()}
        print(target, "divergence", {k: round(v["mean_kl"], 6) for k, v in row["divergence"].items()}, flush=True)
        rows.append(row)
    return {"machine": machine_info(), "torch_threads": torch.get_num_threads(), "args": vars(args), "rows": rows}


def markdown(result: dict[str, Any], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "| context (tokens) | precision | prefill (tok/s) | TTFT (s) | answer of N tokens (s) | decode (ms/token) |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in result["rows"]:
        for name in ("f32", "bf16", "bf16r", "bf16r (rounded outputs)", "bf16 (enable_gqa decode)"):
            if name not in row:
                continue
            r = row[name]
            prefill = f"{r['prefill_tok_s']:.0f}" if "prefill_tok_s" in r else ""
            lines.append(f"| {row['num_tokens']} | {name} | {prefill} | {r['ttft_s']:.3f} | {r['e2e_s']:.2f} | {r['decode_ms_per_token']:.1f} |")
    lines += ["", "| context (tokens) | variant | questions | mean KL | p95 KL | first-token KL | top-1 per position | identical answers |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        for name, d in row["divergence"].items():
            lines.append(f"| {row['num_tokens']} | {name} | {d['num_questions']} | {d['mean_kl']:.2e} | {d['p95_kl']:.2e} | "
                         f"{d['first_token_mean_kl']:.2e} | {100 * d['top1_per_position']:.2f}% | {100 * d['identical']:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 8000])
    p.add_argument("--reps", type=int, default=3, help="timed answers per precision (median)")
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--probes", type=int, default=8, help="questions for the divergence table")
    p.add_argument("--agree-tokens", type=int, default=12)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    command = "python bench/precision_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "precision_speed.json").write_text(json.dumps({**result, "command": command}, indent=1) + "\n")
    (out / "precision_speed.md").write_text(markdown(result, command))
    print(markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
