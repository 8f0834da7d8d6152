"""Block size: what an append's freshness cycle and a full compile cost at each block size, side by side.

Engine level, the real model (SmolLM2-135M, CPU f32), one process: a ~7.4k-token scope of generated memories
(blocks_bench.memory) is compiled from scratch once per block size, then ``--appends`` memories are appended one by
one, alternating the block sizes append by append so that load on the machine falls on all of them alike. Each
append's cycle is what the auto-refresh does at engine level: the incremental compile reusing the stored blocks,
its parts, and the incremental gate's check (``verify_extension``: the new part re-read once in compile's chunks,
4 probes). The figures per block size: the full compile, the cycle's p50 / mean / max, the tokens each cycle
computed.

    OMP_NUM_THREADS=1 .venv/bin/python bench/block_size_bench.py --sizes 256,64 --out bench/results/block_size.json
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from blocks_bench import memories_for, memory  # noqa: E402

from kvengine import make_backend  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="256,64", help="block sizes in tokens, comma-separated")
    parser.add_argument("--tokens", type=int, default=7400, help="scope size before the appends")
    parser.add_argument("--appends", type=int, default=11, help="appends (the scope must stay under the context window)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    backends = {size: make_backend("transformers", dtype="f32", quant="none", block_size=size) for size in sizes}
    rng = random.Random(13)
    texts = memories_for(backends[sizes[0]], rng, args.tokens)
    news = [memory(rng, 10_000 + i) for i in range(args.appends)]
    report: dict = {"machine": platform.processor() or platform.machine(), "config": {**vars(args), "out": str(args.out)}, "sizes": {}}
    stores, logs = {}, {}
    for size in sizes:
        backend = backends[size]
        started = time.perf_counter()
        cartridge = backend.compile(texts)
        full_s = time.perf_counter() - started
        stores[size] = {ref.block_id: data for ref, data in backend.dump_parts(cartridge).blocks}
        logs[size] = list(texts)
        report["sizes"][size] = {"scope_tokens": cartridge.header.num_tokens, "full_compile_s": round(full_s, 2), "cycles": []}
        print(json.dumps({"block_size": size, "full_compile_s": round(full_s, 2)}), flush=True)
    for i in range(args.appends):
        for size in sizes:  # alternated append by append
            backend, store, log = backends[size], stores[size], logs[size]
            log.append(news[i])
            started = time.perf_counter()
            cartridge = backend.compile(log, blocks=store.get)
            for ref, data in backend.dump_parts(cartridge).blocks:
                store.setdefault(ref.block_id, data)
            compiled = time.perf_counter()
            probes = [f"What do you remember about: {' '.join(x.split()[:6])}?" for x in (log[0], log[len(log) // 2], log[-2], log[-1])]
            check = backend.verify_extension(cartridge, log, probes, num_verified_blocks=cartridge.stats["blocks_reused"], max_new_tokens=8)
            checked = time.perf_counter()
            cycle = {"compile_s": round(compiled - started, 3), "check_s": round(checked - compiled, 3), "total_s": round(checked - started, 3),
                     "computed_tokens": cartridge.header.num_tokens - cartridge.stats["blocks_reused"] * size,
                     "by_construction": check.by_construction}
            report["sizes"][size]["cycles"].append(cycle)
            print(json.dumps({"block_size": size, "append": i, **cycle}), flush=True)
    for size, row in report["sizes"].items():
        totals = [c["total_s"] for c in row["cycles"]]
        row.update(cycle_p50_s=round(statistics.median(totals), 3), cycle_mean_s=round(statistics.mean(totals), 3), cycle_max_s=max(totals),
                   computed_tokens_mean=round(statistics.mean(c["computed_tokens"] for c in row["cycles"]), 1))
        print(json.dumps({"block_size": size, **{k: v for k, v in row.items() if k != "cycles"}}), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
