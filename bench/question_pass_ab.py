#!/usr/bin/env python
"""The first token from an ~8k cartridge with the question's pass in kvengine's fused kernels or in torch's.

``--compare attention``: the question's attention in kvengine.fused's kernel (each token over the positions up to
its own), or in torch's CPU flash kernel under the causal mask (``flash``: ``fused.prefix_limits`` refuses every
mask). ``--compare linear``: its products in the fused few-row kernel (``rows``) or in torch's matmul (``one_row``:
``fused.MAX_LINEAR_ROWS`` 1). In those two, every pass runs through the model's own forward (``native_pass.ENABLED``
off). ``--compare layers``: the question's pass and the decoding steps through the decoder's pass in one call
(``one_call``, kvengine.native_pass) or through the model's forward on the same kernels (``per_op``). ``--compare
parts``: the one-call pass in as few parts as a question needs (``one_part``: up to 42 tokens in one) or in parts
of at most 21 tokens (``two_parts``, OLD_PART_TOKENS, as before 30a8843: over 42 tokens, the model's forward). The default
model in ``--dtype``, a cartridge of bench/kv_speed.py's synthetic facts, ``--questions`` of its probes (``--lead``:
a clause before each, for longer questions); the arms alternate question by question, the order flipped every round. Reported per arm: the median first token (``answer()``'s ttft)
and decoding ms per token after it, and whether the arms' greedy answers were the same tokens.

    OMP_NUM_THREADS=2 .venv/bin/python bench/question_pass_ab.py --tokens 8000 --rounds 5 --out bench/results/question_pass_ab.json
    OMP_NUM_THREADS=2 .venv/bin/python bench/question_pass_ab.py --compare linear --out bench/results/question_rows_ab.json
    OMP_NUM_THREADS=2 .venv/bin/python bench/question_pass_ab.py --compare layers --out bench/results/question_layers_ab.json
    OMP_NUM_THREADS=2 .venv/bin/python bench/question_pass_ab.py --compare parts --lead "..." --out bench/results/question_parts_ab.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from kv_speed import emit, machine_info, memories_for, probes  # noqa: E402

from kvengine import fused, make_backend, native_pass  # noqa: E402

OLD_PART_TOKENS = 21  # the one-call pass's part before 30a8843: 64 packed attention rows over 3 query heads per KV head


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8000, help="cartridge size in tokens")
    parser.add_argument("--questions", type=int, default=4, help="questions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compare", choices=("attention", "linear", "layers", "parts"), default="attention", help="which kernel the arms differ in")
    parser.add_argument("--dtype", default="f32", help="the model's dtype (kvengine.config.DTYPES)")
    parser.add_argument("--lead", default="", help="a clause put before each question, for longer questions (e.g. one "
                        "that the one-call pass takes in two parts)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    backend = make_backend("transformers", dtype=args.dtype, quant="none", device="cpu")
    texts = memories_for(backend, args.tokens)
    cartridge = backend.compile(texts)
    questions = [args.lead + q for q, _ in probes(len(texts), args.questions)]
    step = backend._decode_step  # the one-call pass (kvengine.native_pass.NativePass), or a stand-in where there is none
    step = step if isinstance(step, native_pass.NativePass) else types.SimpleNamespace(max_tokens=None)
    saved = limits, most_rows, _, part = fused.prefix_limits, fused.MAX_LINEAR_ROWS, native_pass.ENABLED, step.max_tokens
    if args.compare == "attention":
        arms = {"fused": (limits, most_rows, False, part), "flash": (lambda *a: None, most_rows, False, part)}
    elif args.compare == "linear":
        arms = {"rows": (limits, most_rows, False, part), "one_row": (limits, 1, False, part)}
    elif args.compare == "parts":
        if part is None:
            parser.error("--compare parts needs the one-call pass (kvengine.native_pass): this model and CPU have none")
        arms = {"one_part": (limits, most_rows, True, part), "two_parts": (limits, most_rows, True, min(part, OLD_PART_TOKENS))}
    else:
        arms = {"one_call": (limits, most_rows, True, part), "per_op": (limits, most_rows, False, part)}
    first = {name: [] for name in arms}
    per_token = {name: [] for name in arms}
    tokens = {name: {} for name in arms}
    backend.answer(cartridge, questions[0], max_new_tokens=2)  # warm up
    try:
        for r in range(args.rounds):
            for q in questions:
                for name in arms if r % 2 == 0 else list(arms)[::-1]:
                    fused.prefix_limits, fused.MAX_LINEAR_ROWS, native_pass.ENABLED, step.max_tokens = arms[name]
                    answer = backend.answer(cartridge, q, max_new_tokens=args.max_new_tokens, stop_at_eos=False)
                    first[name].append(answer.ttft_s * 1e3)
                    per_token[name].append((answer.total_s - answer.ttft_s) * 1e3 / max(1, len(answer.token_ids) - 1))
                    tokens[name][q] = answer.token_ids
    finally:
        fused.prefix_limits, fused.MAX_LINEAR_ROWS, native_pass.ENABLED, step.max_tokens = saved
    a, b = arms
    result = {
        "machine": machine_info(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dtype": args.dtype, "compare": args.compare, "cartridge_tokens": cartridge.header.num_tokens, "questions": len(questions), "rounds": args.rounds, "lead": args.lead,
        "question_tokens": [len(backend.layout.encode(backend.layout.suffix_text(q))) for q in questions],
        "first_token_ms": {name: round(statistics.median(v), 1) for name, v in first.items()},
        "decoding_ms_per_token": {name: round(statistics.median(v), 1) for name, v in per_token.items()},
        f"first_token_ratio_{a}_to_{b}": round(statistics.median(first[a]) / statistics.median(first[b]), 3),
        f"decoding_ratio_{a}_to_{b}": round(statistics.median(per_token[a]) / statistics.median(per_token[b]), 3),
        "same_tokens": all(tokens[a][q] == tokens[b][q] for q in questions),
    }
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
