#!/usr/bin/env python
"""What the answer path adds to the model's own passes: the bare passes against answer() and answer_unbatched().

On one ~8k cartridge of bench/kv_speed.py's synthetic facts (the default model, f32), three ways alternate round by
round, so the machine's drift hits them alike: ``passes``, the question's pass and ``--steps`` decoding steps
called directly on the cartridge's scratch tail (bench/answer_profile.py's Passes: no batcher, no sampling, no
detokenization); ``answer()``, the product's path through the batcher's lone row; ``answer_unbatched()``, the
one-at-a-time path. Reported: each way's median first token and decoding ms per token after it (the first round
warms up), and the answer paths' excess over the bare passes.

    OMP_NUM_THREADS=2 .venv/bin/python bench/answer_path_overhead.py --tokens 8000 --rounds 9 --out bench/results/answer_path_overhead.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from answer_profile import Passes  # noqa: E402
from kv_speed import emit, machine_info, memories_for, probes  # noqa: E402

from kvengine import make_backend  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000, help="cartridge size in tokens")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the three ways (the first warms up)")
    parser.add_argument("--steps", type=int, default=8, help="decoding steps after the first token")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", dtype="f32", quant="none", device="cpu")
    texts = memories_for(backend, args.tokens)
    question = probes(len(texts), 1)[0][0]
    cartridge = backend.compile(texts)
    passes = Passes(backend, cartridge, question, args.steps)
    ways = {"passes": [], "answer": [], "answer_unbatched": []}
    for _ in range(args.rounds):
        timed = passes.timed(1)
        ways["passes"].append((timed["first_token_ms"], timed["decode_step_ms"]))
        for name, call in (("answer", backend.answer), ("answer_unbatched", backend.answer_unbatched)):
            answer = call(cartridge, question, max_new_tokens=args.steps + 1, stop_at_eos=False)
            ways[name].append((answer.ttft_s * 1e3, (answer.total_s - answer.ttft_s) * 1e3 / args.steps))
    medians = {name: {"first_token_ms": round(statistics.median(f for f, _ in runs[1:]), 1),
                      "decoding_ms_per_token": round(statistics.median(s for _, s in runs[1:]), 1)}
               for name, runs in ways.items()}
    base = medians["passes"]
    result = {
        "machine": machine_info(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cartridge_tokens": cartridge.header.num_tokens, "question_tokens": len(passes.suffix), "rounds": args.rounds,
        "steps": args.steps, "ways": medians,
        "excess": {name: {key: round(value - base[key], 1) for key, value in m.items()} for name, m in medians.items() if name != "passes"},
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
