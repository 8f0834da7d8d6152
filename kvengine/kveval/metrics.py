"""SQuAD v1.1 exact match and F1 with the official normalization (evaluate-v1.1.py, in kvengine.text)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvengine.text import normalize_answer

__all__ = ["best_over_ground_truths", "exact_match", "f1", "normalize_answer", "squad_scores"]


def exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when the normalized strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between the normalized prediction and one ground truth."""
    pred_tokens = normalize_answer(prediction).split()
    truth_tokens = normalize_answer(ground_truth).split()
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
