#!/usr/bin/env python
"""One question alone on an 8k-token cartridge: the one-at-a-time path vs the batcher, side by side in one process.

The batcher answers a lone question with the one-at-a-time passes on its cartridge's tail (docs/design/batching.md,
"A lone question"); the ``batcher_cascade`` arm forces the cascade path instead (Batcher._solo_begin patched to
refuse), the path a lone question takes when another call holds the tail. The three arms alternate question by question, so drift in the machine's speed
(this 2-core VM's single runs varied 0.87x-1.10x) hits them alike; medians and per-round ratios are reported.
Target: one question alone through the batcher is no slower than the one-at-a-time path (<= 1.05x).

Example: OMP_NUM_THREADS=2 .venv/bin/python bench/lone_question_ab.py --rounds 9 --out bench/results/lone_question_ab.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from batch_throughput import equal_length_questions  # noqa: E402
from kv_speed import machine_info, memories_for  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000, help="cartridge size in memory tokens")
    parser.add_argument("--answer-tokens", type=int, default=32, help="tokens per answer (decoded past end-of-turn)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of the three arms, alternated")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)

    import torch

    import kvengine.batching as batching
    from kvengine import make_backend

    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", model="smollm2-135m-instruct", dtype="f32", quant="none", device="cpu")
    texts = memories_for(backend, args.tokens)
    cartridge = backend.compile(texts)
    questions = equal_length_questions(backend, len(texts), 8)
    solo_begin = batching.Batcher._solo_begin
    n = args.answer_tokens

    def ask(arm: str, question: str):
        if arm == "one_at_a_time":
            return backend.answer_unbatched(cartridge, question, max_new_tokens=n, stop_at_eos=False)
        batching.Batcher._solo_begin = solo_begin if arm == "batcher" else (lambda self, row: False)
        try:
            return backend.answer(cartridge, question, max_new_tokens=n, stop_at_eos=False)
        finally:
            batching.Batcher._solo_begin = solo_begin

    arms = ("one_at_a_time", "batcher", "batcher_cascade")
    for arm in arms:  # warm-up: lazy initialization is not timed
        ask(arm, questions[0])
    runs: dict[str, list] = {arm: [] for arm in arms}
    started = time.time()
    for i in range(args.rounds):
        for arm in arms:
            runs[arm].append(ask(arm, questions[i % len(questions)]))
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{arm} {runs[arm][-1].total_s:.2f} s" for arm in arms), file=sys.stderr, flush=True)
    same = all(a.token_ids == b.token_ids for arm in arms[1:] for a, b in zip(runs[arm], runs["one_at_a_time"], strict=True))
    result = {
        "machine": machine_info(), "threads": args.threads, "num_tokens": cartridge.header.num_tokens, "rounds": args.rounds,
        "elapsed_s": round(time.time() - started, 1), "answers_identical": same,
        "median_total_s": {arm: round(statistics.median(a.total_s for a in runs[arm]), 4) for arm in arms},
        "median_ttft_s": {arm: round(statistics.median(a.ttft_s for a in runs[arm]), 4) for arm in arms},
        "ratio_vs_one_at_a_time": {
            arm: {"of_medians": round(statistics.median(a.total_s for a in runs[arm]) / statistics.median(a.total_s for a in runs["one_at_a_time"]), 3),
                  "median_per_round": round(statistics.median(a.total_s / b.total_s for a, b in zip(runs[arm], runs["one_at_a_time"], strict=True)), 3)}
            for arm in arms[1:]
        },
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
