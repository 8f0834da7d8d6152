"""Tune q8's grouping by the teacher-forced divergence (kvengine.divergence) on SQuAD scopes the final run never sees.

The at-scale kveval run packs its budget-1024 scopes from the first articles of SQuAD dev in file order; this
script packs its scopes from articles further on (--skip), so the method is chosen on other data than it is
measured on. Each candidate patches kvengine.quant's GROUPS/ROTATE, compiles the q8 cartridge (block on block,
as served) and teacher-forces the f32 cartridge's greedy answers through it.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python bench/results/kveval-q8-blocks/tune_q8.py --squad-file squaddev_v1.1.json \
        --out bench/results/kveval-q8-blocks/tune_q8.json
"""
from __future__ import annotations

import argparse
import json
import time

import torch

import kvengine.quant as quant
from kvengine import make_backend
from kvengine.divergence import AnswerDivergence, DivergenceSummary
from kvengine.kveval.data import build_packed_scopes, load_squad, sample_questions
from kvengine.kveval.runner import DEFAULT_QUESTION_TEMPLATE

CANDIDATES = {  # name -> (key group along tokens, value group along head_dim, rotate)
    "k64 v64 rot (format 4)": (64, 64, True),
    "k32 v32 rot": (32, 32, True),
    "k32 v32": (32, 32, False),
    "k32 v64 rot": (32, 64, True),
    "k64 v32 rot": (64, 32, True),
    "k16 v16 rot": (16, 16, True),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--squad-file", required=True)
    p.add_argument("--skip", type=int, default=20, help="articles (file order) left out: the final run's")
    p.add_argument("--scopes", type=int, default=4)
    p.add_argument("--questions", type=int, default=48)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--only", default="", help="comma-separated candidate names")
    p.add_argument("--out", default="")
    a = p.parse_args()
    torch.set_num_threads(1)
    f32 = make_backend("transformers", dtype="f32", device="cpu")
    articles = load_squad(a.squad_file)[a.skip:]
    scopes = build_packed_scopes(articles, 1024, f32.count_tokens, num_scopes=a.scopes)
    picked = sample_questions(scopes, a.questions, seed=1024)
    print("scopes:", [(s.article, s.num_tokens) for s in scopes], "questions:", len(picked), flush=True)
    refs, f32_sizes = [], {}
    for scope in scopes:
        cart = f32.compile(list(scope.paragraphs))
        f32_sizes[scope.article] = len(f32.dumps(cart))
        for s, q in picked:
            if s is scope:
                prompt = DEFAULT_QUESTION_TEMPLATE.format(question=q.question)
                ans = f32.answer(cart, prompt, max_new_tokens=a.max_new_tokens)
                refs.append((scope, prompt, ans.token_ids, f32.answer_logprobs(cart, prompt, ans.token_ids)))
    results = {}
    only = [n for n in a.only.split(",") if n]
    for name, (kg, vg, rot) in CANDIDATES.items():
        if only and name not in only:
            continue
        quant.GROUPS[("q8", "channel")], quant.GROUPS[("q8", "token")] = kg, vg
        quant.ROTATE[("q8", "channel")] = quant.ROTATE[("q8", "token")] = rot
        q8 = f32.variant(quant="q8")
        start = time.perf_counter()
        answers, size, f32_size = [], 0, 0
        for scope in scopes:
            cart = q8.compile(list(scope.paragraphs))
            size += len(q8.dumps(cart))
            f32_size += f32_sizes[scope.article]
            for s, prompt, ids, ref_logp in refs:
                if s is scope:
                    answers.append(AnswerDivergence.of(ref_logp, q8.answer_logprobs(cart, prompt, ids), identical=False))
        d = DivergenceSummary.of(answers).as_dict()
        d.pop("identical")
        d["size_vs_f32"] = size / f32_size
        d["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = d
        print(f"{name}: mean KL {d['mean_kl']:.3e} p95 {d['p95_kl']:.3e} max {d['max_kl']:.3e} first {d['first_token_mean_kl']:.3e} "
              f"top1 {100 * d['top1_per_position']:.2f}% ({d['num_positions']} pos) size {d['size_vs_f32']:.3f} {d['seconds']}s", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"scopes": [(s.article, s.num_tokens) for s in scopes], "questions": len(refs), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
