#!/usr/bin/env python
"""Compile (prefill) tokens/s of this checkout against another revision's, taking turns on the same machine.

A cartridge of bench/kv_speed.py's synthetic facts (``--tokens``, the default model in f32) is compiled in a fresh
process per run, under this checkout's code and under ``--base``'s (a git worktree of that revision in a temporary
folder, removed after; the same virtualenv), the two alternating and the order flipped every round, so the machine's
drift falls on both alike. Each process compiles a short warm-up first, then times one whole compile. Reported: every
run's tokens/s, each side's median and the ratio of the medians (this checkout's to the base's).

    OMP_NUM_THREADS=2 .venv/bin/python bench/compile_speed_ab.py --base 159ccba --rounds 5 --out bench/results/compile_speed_ab.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from kv_speed import emit, machine_info  # noqa: E402

ONE_RUN = """
import sys, time, torch
sys.path.insert(0, sys.argv[1] + "/bench")
from kv_speed import memories_for
from kvengine import make_backend
torch.set_num_threads(int(sys.argv[3]))
backend = make_backend("transformers", dtype="f32", quant="none", device="cpu")
texts = memories_for(backend, int(sys.argv[2]))
backend.compile(texts[:50])
started = time.perf_counter()
cartridge = backend.compile(texts)
per_s = cartridge.header.num_tokens / (time.perf_counter() - started)
try:  # whether this tree's fused kernels loaded (a revision from before them has none)
    from kvengine import fused
    kernels = "loaded" if fused.kernel() is not None else "unavailable"
except ImportError:
    kernels = "none"
print("RESULT", cartridge.header.num_tokens, per_s, kernels)
"""


def run_once(tree: Path, tokens: int, threads: int) -> tuple[int, float, str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", ONE_RUN, str(tree), str(tokens), str(threads)], cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"the run under {tree} failed (exit {done.returncode})")
    _, num_tokens, per_s, kernels = next(line for line in done.stdout.splitlines() if line.startswith("RESULT")).split()
    return int(num_tokens), float(per_s), kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    parser.add_argument("--tokens", type=int, default=8000, help="cartridge size in tokens")
    parser.add_argument("--rounds", type=int, default=6, help="runs per side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds has to be at least 1")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    # the working tree is what runs as "head": say whether it had changes git does not have
    clean = not subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    runs: dict[str, list[float]] = {"head": [], "base": []}
    kernels: dict[str, set[str]] = {"head": set(), "base": set()}
    with tempfile.TemporaryDirectory(prefix="mnesio-base-") as folder:
        tree = Path(folder) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), base], cwd=ROOT, check=True)
        try:
            for r in range(args.rounds):
                for side in ("head", "base") if r % 2 == 0 else ("base", "head"):
                    num_tokens, per_s, loaded = run_once(ROOT if side == "head" else tree, args.tokens, args.threads)
                    runs[side].append(round(per_s, 1))
                    kernels[side].add(loaded)
                    print(f"round {r + 1} {side}: {per_s:.1f} tok/s ({num_tokens} tokens)", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    medians = {side: round(statistics.median(v), 1) for side, v in runs.items()}
    result = {
        "machine": machine_info(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "head": head, "head_clean": clean, "base": base, "cartridge_tokens": num_tokens,
        "fused_kernels": {side: sorted(v) for side, v in kernels.items()}, "rounds": args.rounds, "threads": args.threads,
        "tokens_per_s": runs, "median_tokens_per_s": medians, "ratio_head_to_base": round(medians["head"] / medians["base"], 3),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
