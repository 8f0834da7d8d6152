"""Answer scores: SQuAD v1.1 exact match and F1, and LoCoMo's per-category scores, on one normalization.

SQuAD's normalization is the official one (evaluate-v1.1.py, in kvengine.text). LoCoMo's evaluation
(snap-research/LoCoMo, ``task_eval/evaluation.py``) normalizes the same way and also drops the word "and",
then compares Porter-stemmed tokens; ``locomo_normalize`` is that one normalization plus the extra word, so the
two benchmarks never disagree on what a normalized answer is.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from kvengine.text import normalize_answer

__all__ = [
    "ABSTENTION_PHRASES", "best_over_ground_truths", "evidence_recall", "exact_match", "f1", "locomo_f1",
    "locomo_multi_hop_f1", "locomo_normalize", "locomo_resolve_choice", "locomo_score", "normalize_answer",
    "squad_scores",
]

# LoCoMo scores an adversarial (category 5) answer as right when it says one of these (lower-cased substring)
ABSTENTION_PHRASES = ("no information available", "not mentioned")
_AND = re.compile(r"\band\b")


def exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between the normalized prediction and one ground truth."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def token_f1(pred_tokens: Sequence[str], truth_tokens: Sequence[str]) -> float:
    """F1 of two token lists by their multiset overlap (SQuAD's and LoCoMo's, after their own tokenization)."""
    common = Counter(pred_tokens) & Counter(truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(truth_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_ground_truths(metric, prediction: str, ground_truths: Sequence[str]) -> float:
    """The best score of ``prediction`` against any of the ground truths (SQuAD's max over answers)."""
    if not ground_truths:
        raise ValueError("`ground_truths` has to hold at least one answer but got none")
    return max(metric(prediction, truth) for truth in ground_truths)


def squad_scores(prediction: str, ground_truths: Sequence[str]) -> tuple[float, float]:
    """(exact match, F1) of one prediction, each the max over the ground truths, in [0, 1]."""
    return (
        best_over_ground_truths(exact_match, prediction, ground_truths),
        best_over_ground_truths(f1, prediction, ground_truths),
    )


def locomo_normalize(text: str) -> str:
    """LoCoMo's normalization: SQuAD's, with the word "and" dropped as an article."""
    return " ".join(_AND.sub(" ", normalize_answer(text)).split())


@cache
def _stemmer() -> Any:
    try:
        from nltk.stem import PorterStemmer
    except ImportError as exc:  # pragma: no cover - it is in requirements.txt
        raise ImportError("LoCoMo's F1 stems with NLTK's PorterStemmer; install it with `pip install nltk`") from exc
    return PorterStemmer()


def locomo_f1(prediction: str, ground_truth: str) -> float:
    """LoCoMo's token F1: normalized, Porter-stemmed tokens (task_eval/evaluation.py's ``f1_score``)."""
    stem = _stemmer().stem
    return token_f1([stem(w) for w in locomo_normalize(prediction).split()], [stem(w) for w in locomo_normalize(ground_truth).split()])


def locomo_multi_hop_f1(prediction: str, ground_truth: str) -> float:
    """Category 1: both split on commas; the mean over answer parts of the best F1 of any prediction part."""
    predictions = [p.strip() for p in prediction.split(",")]
    truths = [g.strip() for g in ground_truth.split(",")]
    return sum(max(locomo_f1(p, g) for p in predictions) for g in truths) / len(truths)


def locomo_score(prediction: str, answer: str, category: int) -> float:
    """One LoCoMo answer's score in [0, 1], by its category's rule.

    1 multi-hop: ``locomo_multi_hop_f1``; 2 temporal and 4 single-hop: ``locomo_f1``; 3 open-domain: F1 against
    the answer's part before its first ';'; 5 adversarial: 1 when the prediction says the conversation does not
    hold the answer (``ABSTENTION_PHRASES``), else 0 (``answer`` is not read).
    """
    if category == 5:
        said = prediction.lower()
        return float(any(phrase in said for phrase in ABSTENTION_PHRASES))
    if category == 1:
        return locomo_multi_hop_f1(prediction, answer)
    if category == 3:
        return locomo_f1(prediction, answer.split(";")[0].strip())
    if category in (2, 4):
        return locomo_f1(prediction, answer)
    raise ValueError(f"`category` has to be one of [1, 2, 3, 4, 5] but got {category!r}")


def locomo_resolve_choice(prediction: str, options: Mapping[str, str]) -> str:
    """Map a bare option letter ('a', '(b)') to its option's text, as LoCoMo does for category 5; else unchanged.

    ``options`` maps 'a' and 'b' to the option texts the question offered.
    """
    said = prediction.strip().lower()
    if len(said) == 1:
        return options["a"] if "a" in said else options["b"]
    if len(said) == 3:
        return options["a"] if "(a)" in said else options["b"]
    return prediction


def evidence_recall(retrieved: Sequence[int], evidence: Sequence[int]) -> float | None:
    """The fraction of a question's evidence memories among ``retrieved`` (None when it has no evidence)."""
    wanted = set(evidence)
    if not wanted:
        return None
    return len(wanted & set(retrieved)) / len(wanted)
