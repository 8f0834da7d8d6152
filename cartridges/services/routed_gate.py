"""The gate of a routed scope: on its evaluation cases, the routed answer against its exact reference.

The reference of a routed answer is re-reading the very token ids of the chunks it assembles (kvengine.routed's
``answer_reread``: retrieval, then re-read). For each live case the gate retrieves the memories as an ask does,
decodes the reference, teacher-forces it through the repaired assembly (``routed_divergence``) and requires, over
every answer position of every case, a top-1 agreement of at least ``MNESIO_GATE_MIN_TOP1_PER_POSITION`` and a
mean KL(reference || routed) of at most ``MNESIO_GATE_MAX_MEAN_KL`` (the thresholds the prefix gate's divergence
check uses), and task accuracy no worse than the reference's minus ``MNESIO_GATE_ACCURACY_TOLERANCE``. A scope
whose repair is switched off (or too weak) and whose chunks diverge is refused (GateFailed, 409). Figures hold
numbers only.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from kvengine.divergence import DivergenceSummary
from kvengine.text import normalize_answer
from memories.models import Scope

from .. import conf, engine
from ..selectors import scope_evaluation_cases_open
from .errors import GateFailed
from .routed_answer import routed_memories_choose
from .routed_chunks import repair_policy, routed_chunks_open

log = logging.getLogger("cartridges")


@dataclass
class RoutedGateResult:
    """Whether a routed scope may serve with ``repair``, every failing check as a reason, and the figures."""

    passed: bool
    repair: str
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _correct(answer: str, accepted: list[str]) -> bool:
    said = f" {normalize_answer(answer)} "
    return any(f" {normalize_answer(a)} " in said for a in accepted if normalize_answer(a))


def routed_gate(*, scope: Scope, config: Any, repair: str | None = None, max_new_tokens: int | None = None) -> RoutedGateResult:
    """Gate ``scope``'s routed layout under ``config`` with ``repair`` (default: the configured one)."""
    repair = repair or conf.routed_repair()
    policy = repair_policy(repair)
    max_new = max_new_tokens or conf.answer_max_new_tokens()
    backend = engine.backend_for(config)
    result = RoutedGateResult(passed=True, repair=policy.name)
    answers, correct = [], {"routed": 0, "reread": 0}
    cases = [case for case in scope_evaluation_cases_open(scope=scope) if case.question]
    for case in cases:
        seqs = routed_memories_choose(scope=scope, config=config, question=case.question)
        chunks = routed_chunks_open(scope=scope, config=config, seqs=seqs)
        ordered = [chunks[seq] for seq in seqs if seq in chunks]
        if not ordered:
            continue
        reference = backend.answer_reread(ordered, case.question, max_new_tokens=max_new)
        answers.append(backend.routed_divergence(ordered, case.question, repair=policy, max_new_tokens=max_new, reference=reference))
        routed = backend.answer_routed(ordered, case.question, repair=policy, max_new_tokens=max_new)
        correct["routed"] += _correct(routed.text, case.answers or [])
        correct["reread"] += _correct(reference.text, case.answers or [])
    summary = DivergenceSummary.of(answers)
    num = len(answers)
    result.figures = {
        "num_cases": num, "divergence": asdict(summary),
        "accuracy": {k: (v / num if num else None) for k, v in correct.items()},
    }
    if not num:
        return result  # nothing to compare: as the prefix gate with no cases
    min_top1, max_kl = conf.gate_min_top1_per_position(), conf.gate_max_mean_kl()
    if summary.top1_per_position is not None and summary.top1_per_position < min_top1:
        result.reasons.append(f"top-1 agreement per position {summary.top1_per_position:.3f} is below {min_top1} (repair {policy.name})")
    if summary.mean_kl is not None and summary.mean_kl > max_kl:
        result.reasons.append(f"mean KL {summary.mean_kl:.4f} is above {max_kl} (repair {policy.name})")
    tolerance = conf.gate_accuracy_tolerance()
    if correct["routed"] / num < correct["reread"] / num - tolerance:
        result.reasons.append(
            f"routed accuracy {correct['routed']}/{num} is below re-reading's {correct['reread']}/{num} minus {tolerance}"
        )
    result.passed = not result.reasons
    log.info("routed gate scope=%s repair=%s passed=%s cases=%d", scope.pk, policy.name, result.passed, num)
    return result


def routed_gate_check(*, scope: Scope, config: Any, repair: str | None = None, max_new_tokens: int | None = None) -> RoutedGateResult:
    """routed_gate, refusing (GateFailed, 409 with every reason) when it does not pass."""
    result = routed_gate(scope=scope, config=config, repair=repair, max_new_tokens=max_new_tokens)
    if not result.passed:
        raise GateFailed(
            f"the routed layout of scope '{scope.name}' does not pass its gate with repair {result.repair}", reasons=result.reasons
        )
    return result
