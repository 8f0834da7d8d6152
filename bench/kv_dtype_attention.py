"""The attention of one decoding step and of a question's pass over a cartridge, with the KV kept in f32 or in bf16.

Times, on SmolLM2-135M's shapes (30 layers, 3 key/value heads of 64, 9 query heads packed onto them as
kvengine.attention packs them, random tensors in views of buffers with room past them, as a cache hands them over):
torch's CPU flash attention over f32 and bf16 KV (the query cast to bf16, as under bf16r); kvengine.fused's kernel
(the product's path for a single-token step and for a question's pass, each token over the positions up to its
own); and for bf16 a candidate composed from torch's ops, ``matmul_attention`` (oneDNN's
bf16 matmuls around an f32 softmax, scores compensated to f32 or left rounded to bf16). ``--in-model`` times the
same ways inside the default model's f32 and bf16 decoding steps, alternating step by step.

    OMP_NUM_THREADS=2 .venv/bin/python bench/kv_dtype_attention.py --contexts 2048,8192 --in-model --out bench/results/kv_dtype_attention.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvengine.fused import decode_attention  # noqa: E402

LAYERS, KV_HEADS, GROUPS, HEAD_DIM, ROOM = 30, 3, 3, 64, 64


def matmul_attention(packed: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, *,
                     compensated: bool = True) -> torch.Tensor:
    """Attention of packed queries ``[b, kv, rows, d]`` over bf16 ``key, value [b, kv, n, d]`` as 2D bf16 matmuls.

    A bf16 matmul rounds its f32 accumulator to bf16; ``compensated``: ``addmm`` of the negated rounded scores gives
    the rounding's residue, so their f32 sum is the accumulator to ~2^-17 (the flash kernel keeps f32 scores), at one
    more read of the keys. One matmul per head: a head's ``[n, d]`` slice of a cache view is contiguous, where bmm
    copies the strided view whole. Probabilities are rounded to bf16 for the values' matmul, as in the flash kernel.
    """
    b, kv, rows, _ = packed.shape
    n, heads = key.shape[2], [(i, h) for i in range(b) for h in range(kv)]
    rounded = torch.empty(b * kv, n, rows, dtype=key.dtype)
    residue = torch.empty_like(rounded) if compensated else None
    for j, (i, h) in enumerate(heads):
        torch.mm(key[i, h], packed[i, h].T, out=rounded[j])
        if compensated:
            torch.addmm(rounded[j].neg(), key[i, h], packed[i, h].T, out=residue[j])
    scores = rounded.float() if residue is None else rounded.float().add_(residue.float())
    probs = torch.softmax(scores.mul_(scale).view(b, kv, n, rows).transpose(2, 3), dim=-1)
    probs = probs.to(value.dtype, memory_format=torch.contiguous_format)
    out = torch.empty(b, kv, rows, value.shape[-1], dtype=value.dtype)
    for i, h in heads:
        torch.mm(probs[i, h], value[i, h], out=out[i, h])
    return out


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
    shape = (1, KV_HEADS, context + question + ROOM, HEAD_DIM)  # a cache's buffers: the kernel reads views of them
    keys = [torch.randn(shape, generator=g).to(dtype)[:, :, : context + question] for _ in range(LAYERS)]
    values = [torch.randn(shape, generator=g).to(dtype)[:, :, : context + question] for _ in range(LAYERS)]
    step_q = torch.randn(1, KV_HEADS, GROUPS, HEAD_DIM, generator=g).to(dtype)  # one token's 9 heads, packed
    question_q = torch.randn(1, KV_HEADS, GROUPS * question, HEAD_DIM, generator=g).to(dtype)
    causal = torch.ones(question, question, dtype=torch.bool).tril()
    mask = torch.cat([torch.ones(question, context, dtype=torch.bool), causal], dim=1).repeat(GROUPS, 1)[None, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def step():
        for k, v in zip(keys, values, strict=True):
            sdpa(step_q, k, v)

    def fused_step():
        for k, v in zip(keys, values, strict=True):
            assert decode_attention(step_q, k, v, HEAD_DIM**-0.5) is not None, "the fused kernel did not take the step"

    def matmul_step(compensated: bool):
        for k, v in zip(keys, values, strict=True):
            matmul_attention(step_q, k, v, HEAD_DIM**-0.5, compensated=compensated)

    def question_pass():
        for k, v in zip(keys, values, strict=True):
            sdpa(question_q, k, v, attn_mask=mask)

    limits = torch.arange(context + 1, context + question + 1).repeat(GROUPS)  # each token up to its own position

    def fused_question_pass():
        for k, v in zip(keys, values, strict=True):
            assert decode_attention(question_q, k, v, HEAD_DIM**-0.5, limits) is not None, "the fused kernel did not take the pass"

    kv_bytes = 2 * LAYERS * KV_HEADS * (context + question) * HEAD_DIM * torch.finfo(dtype).bits // 8
    narrow = dtype == torch.bfloat16
    row = {"context": context, "kv_dtype": str(dtype).removeprefix("torch."), "kv_mb": round(kv_bytes / 1e6, 1),
           "decoding_step_attention_ms": round(1e3 * _time(step, reps), 2),
           "decoding_step_fused_ms": round(1e3 * _time(fused_step, reps), 2),
           "decoding_step_matmul_ms": round(1e3 * _time(lambda: matmul_step(True), reps), 2) if narrow else "-",
           "decoding_step_matmul_rounded_ms": round(1e3 * _time(lambda: matmul_step(False), reps), 2) if narrow else "-",
           "question_pass_attention_ms": round(1e3 * _time(question_pass, reps), 2),
           "question_pass_fused_ms": round(1e3 * _time(fused_question_pass, reps), 2), "question_tokens": question}
    return row


def in_model(context: int, steps: int, dtype: str) -> dict:
    """Median ms of the default model's ``dtype`` decoding step over a random ``context``-position state, its attention
    by kvengine.fused's kernel, by the flash kernel (``dense``: torch's linear products too) or (bf16) by
    ``matmul_attention`` compensated or rounded, the ways
    alternating step by step; and each way's largest logit difference from the same step attended in float64."""
    from transformers import AttentionInterface

    import kvengine.fused
    from kvengine import make_backend
    from kvengine.attention import packed_gqa_sdpa
    from kvengine.kvcache import CartridgeCache, KvState

    fused_kernel, row_kernel, way = kvengine.fused.decode_attention, kvengine.fused.linear_rows, {"name": "fused"}

    def candidate(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        name = way["name"]
        if name in ("fused", "flash", "dense") or query.shape[2] != 1 or kwargs.get("mnesio_cascade") is not None:
            kvengine.fused.decode_attention = fused_kernel if name == "fused" else (lambda *a: None)
            return packed_gqa_sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
        packed = query.to(value.dtype).reshape(query.shape[0], key.shape[1], -1, query.shape[-1])  # as packed there
        scale = HEAD_DIM**-0.5 if scaling is None else scaling
        if name == "exact":  # the reference: the same attention in float64, rounded to the KV dtype once
            out = torch.nn.functional.scaled_dot_product_attention(packed.double(), key.double(), value.double(), scale=scale)
            out = out.to(value.dtype)
        else:
            out = matmul_attention(packed, key, value.to(key.dtype), scale, compensated=name == "matmul")
        return out.reshape(query.shape[0], query.shape[1], 1, value.shape[-1]).transpose(1, 2).contiguous(), None

    AttentionInterface.register("bench_kernel", candidate)
    model = make_backend("transformers", dtype=dtype, device="cpu").model
    config = model.config
    served_impl, config._attn_implementation = config._attn_implementation, "bench_kernel"
    kv_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    g = torch.Generator().manual_seed(context)
    with torch.inference_mode():
        state = KvState([torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=g).to(kv_dtype) for _ in range(LAYERS)],
                        [torch.randn(1, KV_HEADS, context, HEAD_DIM, generator=g).to(kv_dtype) for _ in range(LAYERS)], room=ROOM)
    ways = ["fused", "flash", "dense", *(["matmul", "matmul_rounded"] if dtype == "bf16" else [])]
    times, logits = {name: [] for name in ways}, {}

    def step(token: int) -> torch.Tensor:
        kvengine.fused.linear_rows = (lambda *a: None) if way["name"] == "dense" else row_kernel  # dense: torch's products
        cache = CartridgeCache(state)
        try:
            return model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1].float()
        finally:
            cache.crop_back()

    try:
        with torch.inference_mode():
            for name in [*ways, "exact"]:
                way["name"] = name
                logits[name] = step(1000)
            for i in range(steps + 2):
                for name in ways if i % 2 else ways[::-1]:
                    way["name"] = name
                    started = time.perf_counter()
                    int(step(1000 + i).argmax())
                    if i >= 2:
                        times[name].append(time.perf_counter() - started)
    finally:
        config._attn_implementation, kvengine.fused.decode_attention = served_impl, fused_kernel
        kvengine.fused.linear_rows = row_kernel
    diff = {f"{name}_max_logit_diff_from_exact": float(f"{float((logits[name] - logits['exact']).abs().max()):.2g}") for name in ways}
    return {"dtype": dtype, "context": context, "steps": steps, **diff,
            **{f"{name}_step_ms": round(1e3 * statistics.median(t), 1) for name, t in times.items()},
            **{f"{name}_step_ms": "-" for name in ("matmul", "matmul_rounded") if name not in ways}}


def matmul_gflops(size: int = 2048, reps: int = 5) -> float:
    """This machine's f32 matrix product speed on torch's threads (a ``size``-cube matmul, the best of ``reps``):
    the arithmetic ceiling a question's pass, with its 13 tokens' products and attention, can approach."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(_time(lambda: torch.mm(a, b), 1) for _ in range(reps))
    return round(2 * size**3 / best / 1e9, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="2048,8192", help="cartridge lengths in tokens, comma-separated")
    parser.add_argument("--question-tokens", type=int, default=13, help="tokens of the question's pass")
    parser.add_argument("--reps", type=int, default=15, help="timed repetitions (the median is reported)")
    parser.add_argument("--in-model", action="store_true", help="also the model's f32 and bf16 steps, kernel against kernel")
    parser.add_argument("--steps", type=int, default=40, help="steps per kernel in the model (alternating)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    rows = [measure(int(c), args.question_tokens, dtype, args.reps)
            for c in args.contexts.split(",") for dtype in (torch.float32, torch.bfloat16)]
    for row in rows:
        print(row, flush=True)
    model_rows = [in_model(int(c), args.steps, dtype) for dtype in ("f32", "bf16") for c in args.contexts.split(",")
                  ] if args.in_model else []
    for row in model_rows:
        print(row, flush=True)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "") if Path("/proc/cpuinfo").exists() else ""
    result = {"machine": cpu or platform.processor() or platform.machine(), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "f32_matmul_gflops": matmul_gflops(),
              "rows": rows, "in_model": model_rows, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
