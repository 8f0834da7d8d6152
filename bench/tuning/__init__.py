"""Shared by the method-selection scripts (bench/tuning/*.py): f32 reference answers on SQuAD scopes
that the final kveval runs never see, and the teacher-forced divergence of a variant backend from them.

The final kveval runs draw their scopes from the first articles of SQuAD dev in file order; these scripts skip
``--skip`` articles, so a method is chosen on other data than it is measured on.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


def parser(*, scopes: int, questions: int, only_sep: str = ",") -> argparse.ArgumentParser:
    """The selection scripts' common options."""
    p = argparse.ArgumentParser()
    p.add_argument("--squad-file", required=True)
    p.add_argument("--skip", type=int, default=20, help="articles (file order) left out: the final run's")
    p.add_argument("--scopes", type=int, default=scopes)
    p.add_argument("--questions", type=int, default=questions)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--only", default="", help=f"candidate names separated by {only_sep!r}")
    p.add_argument("--out", default="")
    return p


@dataclass
class References:
    """Budget-1024 scopes, and per question: (scope, prompt, f32 answer ids, f32 teacher-forced log-probs)."""

    scopes: list[Any]
    refs: list[tuple[Any, str, list[int], Any]]
    f32_sizes: dict[str, int]  # article -> bytes of its f32 cartridge


def f32_references(f32: Any, args: argparse.Namespace) -> References:
    """Compile each scope in f32, answer its sampled questions greedily and keep the teacher-forced log-probs."""
    from kvengine.kveval.data import build_packed_scopes, load_squad, sample_questions
    from kvengine.kveval.runner import DEFAULT_QUESTION_TEMPLATE

    scopes = build_packed_scopes(load_squad(args.squad_file)[args.skip:], 1024, f32.count_tokens, num_scopes=args.scopes)
    picked = sample_questions(scopes, args.questions, seed=1024)
    print("scopes:", [(s.article, s.num_tokens) for s in scopes], "questions:", len(picked), flush=True)
    refs, sizes = [], {}
    for scope in scopes:
        cart = f32.compile(list(scope.paragraphs))
        sizes[scope.article] = len(f32.dumps(cart))
        for s, q in picked:
            if s is scope:
                prompt = DEFAULT_QUESTION_TEMPLATE.format(question=q.question)
                ans = f32.answer(cart, prompt, max_new_tokens=args.max_new_tokens)
                refs.append((scope, prompt, ans.token_ids, f32.answer_logprobs(cart, prompt, ans.token_ids)))
    return References(scopes, refs, sizes)


def divergence(backend: Any, refs: References) -> tuple[dict[str, Any], float]:
    """``backend``'s teacher-forced divergence from the f32 references (no free decoding), and its size vs f32."""
    from kvengine.divergence import AnswerDivergence, DivergenceSummary

    answers, size, f32_size = [], 0, 0
    for scope in refs.scopes:
        cart = backend.compile(list(scope.paragraphs))
        size += len(backend.dumps(cart))
        f32_size += refs.f32_sizes[scope.article]
        for s, prompt, ids, ref_logp in refs.refs:
            if s is scope:
                answers.append(AnswerDivergence.of(ref_logp, backend.answer_logprobs(cart, prompt, ids), identical=False))
    summary = DivergenceSummary.of(answers).as_dict()
    summary.pop("identical")
    return summary, size / f32_size
