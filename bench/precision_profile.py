"""Where a compile's time goes per precision and block size: torch.profiler's op table.

A scope of generated memories (blocks_bench.memory) is compiled once per (dtype, block size) under torch.profiler;
the table shows each aten op's self CPU time, e.g. the linear layers' ``aten::mm`` against the attention kernel
``aten::_scaled_dot_product_flash_attention_for_cpu``. Also times the attention kernel and a plain QK matmul on
one 256-token chunk over ``--tokens`` cached positions per dtype.

    OMP_NUM_THREADS=1 .venv/bin/python bench/precision_profile.py --dtypes f32,bf16 --block-sizes 256 --tokens 3000
    OMP_NUM_THREADS=2 .venv/bin/python bench/precision_profile.py --dtypes f32 --block-sizes 256,64 --tokens 3000 --no-kernels
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blocks_bench import memories_for  # noqa: E402

from kvengine import make_backend  # noqa: E402


def kernel_ms(fn, reps: int = 5) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - started) / reps * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--tokens", type=int, default=3000, help="scope size to compile (and cached positions for the kernel timing)")
    parser.add_argument("--rows", type=int, default=18)
    parser.add_argument("--block-sizes", default="", help="comma-separated block sizes (default: the backend's)")
    parser.add_argument("--no-kernels", action="store_true", help="skip the single-chunk kernel timings")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}")
    sizes = [int(size) for size in args.block_sizes.split(",") if size]
    for dtype in args.dtypes.split(","):
        for size in sizes or [None]:
            backend = make_backend("transformers", dtype=dtype, quant="none", **({"block_size": size} if size else {}))
            texts = memories_for(backend, random.Random(1), args.tokens)
            backend.compile(texts[:3])  # warm up
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                started = time.perf_counter()
                cartridge = backend.compile(texts)
                seconds = time.perf_counter() - started
            print(f"\n{dtype}, blocks of {backend.block_size}: compile of {cartridge.header.num_tokens} tokens in {seconds:.2f} s")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
        if args.no_kernels:
            continue
        torch_dtype = backend.torch_dtype
        heads, kv_heads, dim, chunk = 9, 3, 64, 256
        q = torch.randn(1, heads, chunk, dim).to(torch_dtype)
        k, v = (torch.randn(1, kv_heads, args.tokens + chunk, dim).to(torch_dtype) for _ in range(2))
        mask = torch.ones(chunk, args.tokens + chunk, dtype=torch.bool).tril(args.tokens)
        sdpa = kernel_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))
        packed = q.reshape(1, kv_heads, heads // kv_heads * chunk, dim)
        qk = kernel_ms(lambda: torch.matmul(packed, k.transpose(-1, -2)))
        print(f"{dtype}: one {chunk}-token chunk over {args.tokens} positions: attention (sdpa) {sdpa:.1f} ms, "
              f"QK matmul alone {qk:.1f} ms (its output in {torch_dtype})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
