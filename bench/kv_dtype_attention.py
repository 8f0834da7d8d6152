"""The attention of one decoding step and of a question's pass over a cartridge, with the KV kept in f32 or in bf16.

The proposed design that moves the decoding floor (BENCHMARKS.md, "Side by side with llama.cpp") keeps the KV in
16 bits through the attention kernel. This measures that kernel alone on SmolLM2-135M's shapes (30 layers,
3 key/value heads of 64, 9 query heads packed onto them as kvengine.attention packs them), with random tensors:
torch's CPU flash attention (``scaled_dot_product_attention``) over f32 keys and values against bf16 ones (the
query cast to bf16, as kvengine.attention does under bf16r). It times the kernel, not an answer.

    OMP_NUM_THREADS=2 .venv/bin/python bench/kv_dtype_attention.py --contexts 2048,8192 --out bench/results/kv_dtype_attention.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

LAYERS, KV_HEADS, GROUPS, HEAD_DIM = 30, 3, 3, 64


def _time(fn, reps: int) -> float:
    fn()  # warm-up
    runs = []
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def measure(context: int, question: int, dtype: torch.dtype, reps: int) -> dict:
    """Median ms of all layers' attention for one decoding step and for a ``question``-token pass with its mask."""
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(1, KV_HEADS, context + question, HEAD_DIM, generator=g).to(dtype) for _ in range(LAYERS)]
    values = [torch.randn(1, KV_HEADS, context + question, HEAD_DIM, generator=g).to(dtype) for _ in range(LAYERS)]
    step_q = torch.randn(1, KV_HEADS, GROUPS, HEAD_DIM, generator=g).to(dtype)  # one token's 9 heads, packed
    question_q = torch.randn(1, KV_HEADS, GROUPS * question, HEAD_DIM, generator=g).to(dtype)
    causal = torch.ones(question, question, dtype=torch.bool).tril()
    mask = torch.cat([torch.ones(question, context, dtype=torch.bool), causal], dim=1).repeat(GROUPS, 1)[None, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def step():
        for k, v in zip(keys, values, strict=True):
            sdpa(step_q, k, v)

    def question_pass():
        for k, v in zip(keys, values, strict=True):
            sdpa(question_q, k, v, attn_mask=mask)

    kv_bytes = 2 * LAYERS * KV_HEADS * (context + question) * HEAD_DIM * torch.finfo(dtype).bits // 8
    return {"context": context, "kv_dtype": str(dtype).removeprefix("torch."), "kv_mb": round(kv_bytes / 1e6, 1),
            "decoding_step_attention_ms": round(1e3 * _time(step, reps), 2),
            "question_pass_attention_ms": round(1e3 * _time(question_pass, reps), 2), "question_tokens": question}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192", help="cartridge lengths in tokens, comma-separated")
    parser.add_argument("--question-tokens", type=int, default=13, help="tokens of the question's pass")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions (the median is reported)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    rows = [measure(int(c), args.question_tokens, dtype, args.reps)
            for c in args.contexts.split(",") for dtype in (torch.float32, torch.bfloat16)]
    result = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "rows": rows}
    for row in rows:
        print(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
