"""The full gate's model checks: fidelity on probes against one text re-reading, task accuracy against text and
the retrieval baseline, and divergence from an f32 cartridge (checks 5-7, committable.py's docstring)."""
from __future__ import annotations

import time

from kvengine import KvConfig, KvError
from kvengine.divergence import AnswerDivergence, DivergenceSummary
from kvengine.retrieval import bm25_top_k  # one BM25 and one answer normalization, shared with kveval
from kvengine.text import answer_correct

from ... import conf, engine
from ...models import CartridgeVersion
from ...selectors import (
    scope_evaluation_cases_num_erased,
    scope_evaluation_cases_open,
)
from .checks import GateResult, accuracy_record, auto_probes, version_loaded


def full_checks(*, version: CartridgeVersion, backend, config, result: GateResult) -> None:
    """Fidelity on probes and task accuracy against text re-reading and the retrieval baseline."""
    loaded = version_loaded(version=version, backend=backend, config=config, result=result)
    if loaded is None:
        return
    cartridge, _, texts = loaded
    # erased cases (a subject they concern was erased) cannot be opened: the gate runs without them, counted
    cases = scope_evaluation_cases_open(scope=version.scope)
    num_cases_erased = scope_evaluation_cases_num_erased(scope=version.scope)
    probes = auto_probes(texts, conf.gate_num_auto_probes()) + [c.question for c in cases]
    started = time.perf_counter()
    try:
        # the threshold is on the first token; the decode length bounds the whole-answer comparison
        fid = backend.fidelity(cartridge, texts, probes, max_new_tokens=conf.gate_fidelity_max_new_tokens())
    except KvError as exc:
        result.fail(f"the fidelity probe failed: {exc}")
        return
    threshold = conf.gate_min_fidelity()
    result.figures["fidelity"] = {**fid.as_dict(), "threshold": threshold, "seconds": round(time.perf_counter() - started, 3)}
    if fid.top1_agreement < threshold:
        result.fail(
            f"fidelity {fid.top1_agreement:.3f} (top-1 agreement with text re-reading on {fid.num_probes} probes) "
            f"is below the threshold {threshold}"
        )
    divergence_check(version=version, backend=backend, cartridge=cartridge, texts=texts, probes=probes, result=result)
    k = conf.gate_retrieval_top_k()
    max_new = conf.gate_max_new_tokens()
    correct = {"cartridge": 0, "text": 0, "retrieval": 0}
    ttft = {"cartridge": 0.0, "text": 0.0, "retrieval": 0.0}
    for case in cases:
        answers = {
            "cartridge": backend.answer(cartridge, case.question, max_new_tokens=max_new),
            "text": backend.answer_from_text(texts, case.question, max_new_tokens=max_new),
            "retrieval": backend.answer_from_text(bm25_top_k(texts, case.question, k), case.question, max_new_tokens=max_new),
        }
        for mode, ans in answers.items():
            correct[mode] += answer_correct(ans.text, list(case.answers))
            ttft[mode] += ans.ttft_s
    accuracy_record(version=version, cases=cases, num_cases_erased=num_cases_erased, correct=correct, ttft=ttft, result=result)


def divergence_check(*, version: CartridgeVersion, backend, cartridge, texts: list[str], probes: list[str], result: GateResult) -> None:
    """Check 7 (committable.py's docstring): the variant's teacher-forced divergence from an f32 cartridge on the probes."""
    config = backend.describe().config
    if (config.dtype, config.quant) == ("f32", "none"):
        return  # the reference itself
    if not hasattr(backend, "answer_logprobs"):
        result.figures["divergence"] = "skipped: the backend has no next-token distributions"
        return
    started = time.perf_counter()
    reference = engine.backend_for(KvConfig(backend=config.backend, model=config.model, dtype="f32", quant="none"))
    max_new = conf.gate_fidelity_max_new_tokens()
    answers = []
    try:
        reference_cartridge = reference.compile(texts)
        for probe in probes:
            ref_answer = reference.answer(reference_cartridge, probe, max_new_tokens=max_new)
            ref_logp = reference.answer_logprobs(reference_cartridge, probe, ref_answer.token_ids)
            var_logp = backend.answer_logprobs(cartridge, probe, ref_answer.token_ids)
            var_answer = backend.answer(cartridge, probe, max_new_tokens=max_new)
            answers.append(AnswerDivergence.of(ref_logp, var_logp, identical=var_answer.token_ids == ref_answer.token_ids))
    except KvError as exc:
        result.fail(f"the divergence check failed: {exc}")
        return
    summary = DivergenceSummary.of(answers)
    max_mean_kl, min_top1 = conf.gate_max_mean_kl(), conf.gate_min_top1_per_position()
    result.figures["divergence"] = {
        **summary.as_dict(),
        "reference": "f32 cartridge, teacher-forced",
        "max_mean_kl": max_mean_kl,
        "min_top1_per_position": min_top1,
        "seconds": round(time.perf_counter() - started, 3),
    }
    if summary.mean_kl is not None and summary.mean_kl > max_mean_kl:
        result.fail(
            f"mean KL divergence {summary.mean_kl:.4g} from f32 over {summary.num_positions} answer positions of "
            f"{summary.num_questions} probes is above the threshold {max_mean_kl}"
        )
    if summary.top1_per_position is not None and summary.top1_per_position < min_top1:
        result.fail(
            f"top-1 agreement with f32 per answer position {summary.top1_per_position:.3f} is below the threshold {min_top1}"
        )
