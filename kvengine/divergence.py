"""The divergence measure: how far a variant's next-token distributions are from the reference's (f32).

Greedy identity over a 135M model's near-ties is a noisy judge: one near-tie flips a token and the rest of
the answer drifts. So the reference (f32) answer's tokens are teacher-forced through the variant after the
question, both asked for the same positions (each answer token's and the one after the last), and per
position we take ``KL(reference || variant) = sum_v p_ref(v) * (log p_ref(v) - log p_var(v))`` and whether
the two argmaxes agree. Summaries: the mean and nearest-rank p95 over all positions of all questions, the
first position's mean (the "first-token KL"), top-1 agreement per position, and the share of whole greedy
answers identical (the variant decoding freely for that one).

kveval, bench/kv_speed.py and the gate (cartridges/services/gate.py) all use this one. Torch is imported only
by the functions that take tensors, so the summaries are usable without it (the fake backend, Django).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


# -- the measure --------------------------------------------------------------------------------------
def kl_divergence(reference_logp: Any, variant_logp: Any) -> Any:
    """KL(reference || variant) per row of two [..., vocab] log-probability tensors, in nats, >= 0.

    Computed in float64 so that identical distributions give exactly 0 and tiny KLs are not float noise.
    """
    if reference_logp.shape != variant_logp.shape:
        raise ValueError(f"log-prob shapes differ: {tuple(reference_logp.shape)} vs {tuple(variant_logp.shape)}")
    import torch

    ref = reference_logp.double()
    var = variant_logp.double()
    p = ref.exp()
    # 0 * log 0 terms are 0: where p_ref is 0 its row entry contributes nothing (even if log p_var is -inf)
    terms = torch.where(p > 0, p * (ref - var), torch.zeros_like(p))
    return terms.sum(-1).clamp_min(0.0)


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


@dataclass
class AnswerDivergence:
    """One question: per-position KLs and top-1 agreement, and whether the free-running answers were identical."""

    kls: list[float]
    top1: list[bool]
    identical: bool

    @classmethod
    def of(cls, reference_logp: Any, variant_logp: Any, *, identical: bool) -> AnswerDivergence:
        """From the teacher-forced [positions, vocab] log-probs of the reference and the variant."""
        kls = kl_divergence(reference_logp, variant_logp)
        top1 = reference_logp.argmax(-1) == variant_logp.argmax(-1)
        return cls(kls=[float(k) for k in kls], top1=[bool(t) for t in top1], identical=bool(identical))


@dataclass
class DivergenceSummary:
    """The measure over many questions (module docstring); numbers only."""

    num_questions: int
    num_positions: int
    mean_kl: float | None
    p95_kl: float | None
    max_kl: float | None
    first_token_mean_kl: float | None
    top1_per_position: float | None
    first_token_top1: float | None
    identical: float | None

    @classmethod
    def of(cls, answers: Sequence[AnswerDivergence]) -> DivergenceSummary:
        kls = [k for a in answers for k in a.kls]
        top1 = [t for a in answers for t in a.top1]
        firsts = [a for a in answers if a.kls]
        n = len(answers)
        return cls(
            num_questions=n,
            num_positions=len(kls),
            mean_kl=sum(kls) / len(kls) if kls else None,
            p95_kl=nearest_rank(kls, 0.95),
            max_kl=max(kls) if kls else None,
            first_token_mean_kl=sum(a.kls[0] for a in firsts) / len(firsts) if firsts else None,
            top1_per_position=sum(top1) / len(top1) if top1 else None,
            first_token_top1=sum(a.top1[0] for a in firsts) / len(firsts) if firsts else None,
            identical=sum(a.identical for a in answers) / n if n else None,
        )

    def as_dict(self) -> dict:
        return asdict(self)
