"""The gate: cartridge_is_committable() and the evaluations it records.

Checks, in order: not destroyed; compiled under the active configuration with the active backend's
compatibility key; no erased subject in the manifest; blob intact; then the model checks (fidelity against
re-reading the memories as text, task accuracy on the scope's evaluation cases beside a BM25 retrieval
baseline, and, for a bf16 or quantized configuration, divergence from an f32 reference). Every failing check
is a reason; figures hold numbers only, never memory or question text.

Two gates: the full gate runs every check; the incremental gate (``gate="auto"``, f32 only) takes the blocks
an earlier passing version verified as proven and re-reads only the new part on top of them.
``figures["gate"]`` says which ran, ``figures["gate_cost"]`` what it cost.

Design, and why the incremental gate is as strong as the full one: docs/design/gate.md.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core.errors import MnesioError
from kvengine import CorruptCartridgeError, IncompatibleCartridgeError, KvConfig, KvError
from kvengine.divergence import AnswerDivergence, DivergenceSummary
from kvengine.format import BlockRef, header_blocks, read_header, read_tail_part
from kvengine.retrieval import bm25_top_k  # one BM25 and one answer normalization, shared with kveval
from kvengine.text import answer_correct
from memories.selectors import scope_memories_open

from .. import conf, engine
from ..models import CartridgeDestruction, CartridgeEvaluation, CartridgeVersion, CartridgeVersionBlock
from ..selectors import (
    ActiveConfiguration,
    active_configuration,
    evaluation_cases_digest,
    scope_evaluation_cases_num_erased,
    scope_evaluation_cases_open,
    version_erased_subjects,
)
from ..storage import BlobTampered, BlobUnavailable, version_parts_read
from .blocksecret import scope_block_secret
from .compile import key_digest


@dataclass
class GateResult:
    """The outcome of cartridge_is_committable(): passed, every reason, and the figures measured."""

    passed: bool = True
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, reason: str) -> None:
        self.passed = False
        self.reasons.append(reason)


def auto_probes(texts: list[str], num: int) -> list[str]:
    """Probe questions made from the memories: evenly spaced memories, asked about by their opening words."""
    if not texts:
        return []
    num = min(num, len(texts))
    picks = sorted({round(i * (len(texts) - 1) / max(num - 1, 1)) for i in range(num)})
    probes = []
    for i in picks:
        words = texts[i].split()[:6]
        probes.append(f"What do you remember about: {' '.join(words)}?")
    return probes


GATES = ("full", "auto")  # what a caller asks for; "auto" runs the incremental gate when it applies
# How many of the scope's newest passing evaluations are searched for the parent with the longest shared prefix.
MAX_PARENT_CANDIDATES = 20


def cartridge_is_committable(*, version: CartridgeVersion, model_checks: bool = True, gate: str = "full", defer_full: bool = False) -> GateResult:
    """Run the gate over ``version``; ``model_checks=False`` runs only the cheap checks (1-4), no model work.

    ``gate="auto"`` runs the incremental gate when the module docstring's conditions hold, else the full one.
    ``defer_full=True`` (an auto-refresh): a full gate that is only due by the schedule does not run here; the
    incremental gate runs and ``figures["incremental"]["full_due"]`` tells the caller to run the full gate after.
    """
    if gate not in GATES:
        raise MnesioError(f"`gate` has to be one of {list(GATES)} but got {gate!r}", extra={"field": "gate"})
    result = GateResult()
    config = active_configuration()
    result.figures["configuration"] = config.as_dict()
    destruction = CartridgeDestruction.objects.filter(version=version).first()
    if destruction is not None:
        result.fail(f"version {version.pk} is destroyed ({destruction.reason}); its blob and key no longer exist")
        return result
    if version.config != config.config:
        result.fail(
            f"version {version.pk} was compiled for configuration {version.config.key} "
            f"but the active configuration is {config.key()}; recompile the scope"
        )
        return result
    backend = engine.backend_for(config)
    compat = backend.describe().compat_key()
    diffs = [k for k, v in compat.items() if getattr(version, k) != v]
    if diffs:
        result.fail(f"version {version.pk} has another compatibility key than the active backend (differs in: {', '.join(diffs)})")
    erased = version_erased_subjects(version=version)  # from the manifest, never the subject index
    if erased:
        result.fail(f"the manifest of version {version.pk} includes {len(erased)} erased subject(s): {sorted(erased)}")
    try:
        # every stored part's digest, GCM tag and sha256 (blocks from this process's verified cache when it has them)
        tail, blocks = version_parts_read(version=version)
    except (BlobUnavailable, BlobTampered) as exc:
        result.fail(exc.message)
        return _finish(result, model_checks)
    try:
        if not version.block_size and not blocks:
            header = read_header(tail)  # a version stored whole: one file, no block parts
        else:
            header, _, _ = read_tail_part(tail)
        refs = header_blocks(header)
        if any(ref.block_id not in blocks for ref in refs):
            raise CorruptCartridgeError("its header names blocks the version does not link")
    except CorruptCartridgeError as exc:
        result.fail(f"the cartridge file of version {version.pk} is corrupt: {exc}")
        return _finish(result, model_checks)
    if key_digest(header.compat_key()) != version.key_digest or header.log_head != version.log_head or header.num_tokens != version.num_tokens:
        result.fail(f"the cartridge header of version {version.pk} disagrees with its version row (key, head or token count)")
    result.figures["blob"] = {"size_bytes": version.size_bytes, "intact": True}
    if not model_checks or not result.passed:
        return _finish(result, model_checks)
    plan = _incremental_plan(version=version, config=config, refs=refs, defer_full=defer_full) if gate == "auto" else _Plan(reason="asked for the full gate")
    started = time.perf_counter()
    if plan.parent is None:
        _model_checks(version=version, backend=backend, config=config, result=result)
        tokens = (result.figures.get("fidelity", {}).get("num_probes", 0) + result.figures.get("accuracy", {}).get("num_cases", 0)) * version.num_tokens
        result.figures["gate"] = "full"
        result.figures["gate_cost"] = {"seconds": round(time.perf_counter() - started, 3), "tokens_reread": tokens, "why_full": plan.reason}
    else:
        _incremental_checks(version=version, backend=backend, config=config, plan=plan, result=result)
        result.figures["gate"] = "incremental"
        result.figures["gate_cost"] = {
            "seconds": round(time.perf_counter() - started, 3),
            "tokens_reread": (result.figures.get("incremental") or {}).get("num_new_tokens", 0),
        }
    # what this evaluation vouches for, when it passes: every block of the version (a later version's parent)
    # by block row: an id or digest here would outlive the block's destruction in an immutable row (services/erase.py)
    result.figures["verified_blocks"] = _block_rows(version)
    return result


def _block_rows(version: CartridgeVersion) -> list[int]:
    """The CartridgeBlock pks of ``version``'s blocks in order: one row is one (keyed id, part digest) of one scope."""
    return list(CartridgeVersionBlock.objects.filter(version=version).order_by("index").values_list("block_id", flat=True))


@dataclass
class _Plan:
    """Which gate runs: the parent evaluation and how many leading blocks it verified, or why the full gate runs."""

    parent: CartridgeEvaluation | None = None
    num_verified_blocks: int = 0
    since_full: int = 0  # the scope's versions gated incrementally since its newest full gate, this one included
    reason: str = ""
    full_due: bool = False  # the schedule calls for a full gate, deferred by the caller to after activation


def _incremental_plan(*, version: CartridgeVersion, config: ActiveConfiguration, refs: list[BlockRef], defer_full: bool = False) -> _Plan:
    """Find the passing evaluation that verified the longest run of this version's leading blocks (module docstring)."""
    if (config.dtype, config.quant) != ("f32", "none"):
        return _Plan(reason=f"{config.dtype}/{config.quant} is gated in full (divergence from f32 needs the whole log)")
    if not refs:
        return _Plan(reason="the cartridge has no full block")
    candidates = (
        CartridgeEvaluation.objects.filter(
            version__scope_id=version.scope_id, version__key_digest=version.key_digest, passed=True, config_key=config.key(),
            figures__gate__in=["full", "incremental"],
        )
        .exclude(version_id=version.pk)
        .order_by("-created_at", "-id")
    )
    if config.row is not None:  # after a switch, only what was verified under this activation of the configuration
        candidates = candidates.filter(created_at__gte=config.row.created_at)
    # a version that failed a full gate (a scheduled one, after its incremental pass) vouches for none of its blocks
    failed = CartridgeEvaluation.objects.filter(
        version__scope_id=version.scope_id, passed=False, config_key=config.key(), figures__gate="full"
    ).values("version_id")
    candidates = candidates.exclude(version_id__in=failed)
    best = _Plan(reason="no earlier version of the scope that passed the gate under the active configuration shares its first block")
    mine = _block_rows(version)
    for evaluation in candidates[:MAX_PARENT_CANDIDATES]:
        verified = evaluation.figures.get("verified_blocks") or []
        num = 0
        while num < min(len(verified), len(mine)) and verified[num] == mine[num]:
            num += 1
        if num > best.num_verified_blocks:
            best = _Plan(parent=evaluation, num_verified_blocks=num)
    if best.parent is None:
        return best
    # the schedule counts the scope's versions gated incrementally since its newest passing full gate (any version's:
    # a scheduled full gate runs on the version serving while newer ones are gated, and it still resets the count)
    last_full = candidates.filter(figures__gate="full").values_list("created_at", flat=True).first()
    since = candidates.filter(figures__gate="incremental")
    if last_full is not None:
        since = since.filter(created_at__gt=last_full)
    best.since_full = since.order_by().values("version_id").distinct().count() + 1
    if best.since_full >= conf.gate_full_every():
        if defer_full:
            best.full_due = True
            return best
        return _Plan(reason=f"scheduled: every {conf.gate_full_every()}th version of an incremental chain runs the full gate")
    return best


def _version_texts(*, version: CartridgeVersion, result: GateResult) -> tuple[list[int], list[str]] | None:
    """The version's memories (seqs and texts) opened from the log; None (and a reason) when the log no longer yields them."""
    seqs = [entry[0] for entry in version.manifest["entries"]]
    opened = {m.seq: m for m in scope_memories_open(scope=version.scope, as_of=version.log_head)}
    if any(s not in opened or opened[s].erased for s in seqs):
        result.fail(f"the log no longer yields every memory of version {version.pk}; it cannot be compared with text")
        return None
    return seqs, [opened[s].text for s in seqs]


def _loaded(*, version: CartridgeVersion, backend, config, result: GateResult) -> tuple[Any, list[int], list[str]] | None:
    """The version's loaded cartridge (this process's cache, or its parts, every one verified) and its memories
    opened from the log; None (and a reason) when either fails."""
    try:
        cartridge, _ = engine.cartridge_load(version=version, config=config, record_refusal=False)
    except (IncompatibleCartridgeError, CorruptCartridgeError, BlobUnavailable, BlobTampered) as exc:
        result.fail(f"the backend refuses to load version {version.pk}: {getattr(exc, 'message', exc)}")
        return None
    opened = _version_texts(version=version, result=result)
    return None if opened is None else (cartridge, *opened)


def _incremental_checks(*, version: CartridgeVersion, backend, config, plan: _Plan, result: GateResult) -> None:
    """Checks (a)-(d) of the incremental gate (module docstring)."""
    loaded = _loaded(version=version, backend=backend, config=config, result=result)
    if loaded is None:
        return
    cartridge, seqs, texts = loaded
    parent_version = plan.parent.version
    known = {entry[0] for entry in parent_version.manifest["entries"]}
    new_texts = [text for seq, text in zip(seqs, texts, strict=True) if seq not in known]
    num_probes = conf.gate_num_auto_probes()
    cases = scope_evaluation_cases_open(scope=version.scope)
    num_cases_erased = scope_evaluation_cases_num_erased(scope=version.scope)
    auto = auto_probes(texts, num_probes)
    probes = auto + [p for p in auto_probes(new_texts[-num_probes:], num_probes) if p not in auto] + [c.question for c in cases]
    max_new = conf.gate_max_new_tokens()
    started = time.perf_counter()
    try:
        check = backend.verify_extension(
            cartridge, texts, probes, num_verified_blocks=plan.num_verified_blocks, block_secret=scope_block_secret(scope=version.scope),
            max_new_tokens=conf.gate_fidelity_max_new_tokens(), questions=[c.question for c in cases], answer_max_new_tokens=max_new,
        )
    except KvError as exc:
        result.fail(f"the incremental check failed: {exc}")
        return
    max_diff = conf.gate_max_kv_abs_diff()
    result.figures["incremental"] = {
        **check.as_dict(), "parent_evaluation_id": plan.parent.pk, "parent_version_id": parent_version.pk,
        "num_new_memories": len(new_texts), "since_full": plan.since_full, "max_kv_abs_diff": max_diff, "full_due": plan.full_due,
    }
    if not check.chain_matches:
        result.fail(f"the block ids of version {version.pk} are not the chain of its memories' tokens; its blocks are not the verified ones")
    if not check.max_abs_diff <= max_diff:
        result.fail(
            f"the KV of the new part of version {version.pk} ({check.num_new_tokens} tokens) differs from its one-pass "
            f"re-reading by up to {check.max_abs_diff:.4g}, above the threshold {max_diff}"
        )
    fid = check.fidelity
    threshold = conf.gate_min_fidelity()
    result.figures["fidelity"] = {**fid.as_dict(), "threshold": threshold, "seconds": round(time.perf_counter() - started, 3), "reference": "new part re-read on the verified blocks"}
    if fid.top1_agreement < threshold:
        result.fail(
            f"fidelity {fid.top1_agreement:.3f} (top-1 agreement with re-reading the new part on the verified blocks, on "
            f"{fid.num_probes} probes) is below the threshold {threshold}"
        )
    k = conf.gate_retrieval_top_k()
    correct = {"cartridge": 0, "text": 0, "retrieval": 0}
    ttft = {"cartridge": 0.0, "text": 0.0, "retrieval": 0.0}
    for case, (from_cartridge, from_text) in zip(cases, check.answers, strict=True):
        retrieval = backend.answer_from_text(bm25_top_k(texts, case.question, k), case.question, max_new_tokens=max_new)
        for mode, ans in (("cartridge", from_cartridge), ("text", from_text), ("retrieval", retrieval)):
            correct[mode] += answer_correct(ans.text, list(case.answers))
            ttft[mode] += ans.ttft_s
    _accuracy_record(version=version, cases=cases, num_cases_erased=num_cases_erased, correct=correct, ttft=ttft, result=result)


def _finish(result: GateResult, model_checks: bool) -> GateResult:
    if model_checks and not result.passed:
        result.figures["model_checks"] = "skipped: the checks above failed"
    return result


def _model_checks(*, version: CartridgeVersion, backend, config, result: GateResult) -> None:
    """Fidelity on probes and task accuracy against text re-reading and the retrieval baseline."""
    loaded = _loaded(version=version, backend=backend, config=config, result=result)
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
    _divergence_check(version=version, backend=backend, cartridge=cartridge, texts=texts, probes=probes, result=result)
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
    _accuracy_record(version=version, cases=cases, num_cases_erased=num_cases_erased, correct=correct, ttft=ttft, result=result)


def _accuracy_record(*, version: CartridgeVersion, cases, num_cases_erased: int, correct: dict, ttft: dict, result: GateResult) -> None:
    """Check 6's figures and failures from the counts of correct answers per mode."""
    tolerance = conf.gate_accuracy_tolerance()
    k = conf.gate_retrieval_top_k()
    n = len(cases)
    accuracy = {mode: (correct[mode] / n if n else None) for mode in correct}
    result.figures["accuracy"] = {
        "num_cases": n,
        "num_cases_erased": num_cases_erased,
        **accuracy,
        "tolerance": tolerance,
        "retrieval_top_k": k,
        "retrieval_required": conf.gate_require_retrieval_baseline(),
        "mean_ttft_s": {mode: (ttft[mode] / n if n else None) for mode in ttft},
        "cases_digest": evaluation_cases_digest(scope=version.scope),
    }
    if n:
        if accuracy["cartridge"] < accuracy["text"] - tolerance - 1e-9:
            result.fail(
                f"task accuracy {accuracy['cartridge']:.3f} on {n} cases is below text re-reading's "
                f"{accuracy['text']:.3f} minus the tolerance {tolerance}"
            )
        if conf.gate_require_retrieval_baseline() and accuracy["cartridge"] < accuracy["retrieval"] - tolerance - 1e-9:
            result.fail(
                f"task accuracy {accuracy['cartridge']:.3f} on {n} cases is below the top-{k} retrieval baseline's "
                f"{accuracy['retrieval']:.3f} minus the tolerance {tolerance}"
            )


def _divergence_check(*, version: CartridgeVersion, backend, cartridge, texts: list[str], probes: list[str], result: GateResult) -> None:
    """Check 7 (module docstring): the variant's teacher-forced divergence from an f32 cartridge on the probes."""
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


def cartridge_evaluate(
    *, version: CartridgeVersion, actor=None, gate: str = "full", defer_full: bool = False, stage: str = "evaluate"
) -> CartridgeEvaluation:
    """Run the gate over ``version`` and record the evaluation (passed or not, every reason, the figures).

    ``gate="full"`` (the default: an explicit evaluation) always runs the full gate; ``"auto"`` (the follow-up of
    a compile, an auto-refresh) runs the incremental one when it applies (module docstring); ``defer_full``: see
    cartridge_is_committable.
    """
    if not isinstance(version, CartridgeVersion):
        raise MnesioError("`version` has to be a cartridge version", extra={"field": "version"})
    result = cartridge_is_committable(version=version, gate=gate, defer_full=defer_full)
    return evaluation_record(version=version, result=result, actor=actor, stage=stage)


def evaluation_record(*, version: CartridgeVersion, result: GateResult, actor=None, stage: str = "evaluate") -> CartridgeEvaluation:
    """Write a gate result as an evaluation row."""
    figures = {**result.figures, "stage": stage}
    figures.setdefault("accuracy", {}).setdefault("cases_digest", evaluation_cases_digest(scope=version.scope))
    return CartridgeEvaluation.objects.create(
        version=version,
        passed=result.passed,
        reasons=result.reasons,
        figures=figures,
        config_key=active_configuration().key(),
        created_by=actor,
    )
