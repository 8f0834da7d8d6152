"""The incremental gate: find the passing evaluation whose verified blocks this version starts with, then check
only the new part on top of them (checks (a)-(d), committable.py's docstring)."""
from __future__ import annotations

import time
from dataclasses import dataclass

from kvengine import KvError
from kvengine.format import BlockRef
from kvengine.retrieval import bm25_top_k  # one BM25 and one answer normalization, shared with kveval
from kvengine.text import answer_correct

from ... import conf
from ...models import CartridgeEvaluation, CartridgeVersion, CartridgeVersionBlock
from ...selectors import (
    ActiveConfiguration,
    scope_evaluation_cases_num_erased,
    scope_evaluation_cases_open,
)
from ..blocksecret import scope_block_secret
from .checks import GateResult, accuracy_record, auto_probes, version_loaded

# How many of the scope's newest passing evaluations are searched for the parent with the longest shared prefix.
MAX_PARENT_CANDIDATES = 20


def block_rows(version: CartridgeVersion) -> list[int]:
    """The CartridgeBlock pks of ``version``'s blocks in order: one row is one (keyed id, part digest) of one scope."""
    return list(CartridgeVersionBlock.objects.filter(version=version).order_by("index").values_list("block_id", flat=True))


@dataclass
class GatePlan:
    """Which gate runs: the parent evaluation and how many leading blocks it verified, or why the full gate runs."""

    parent: CartridgeEvaluation | None = None
    num_verified_blocks: int = 0
    since_full: int = 0  # the scope's versions gated incrementally since its newest full gate, this one included
    reason: str = ""
    full_due: bool = False  # the schedule calls for a full gate, deferred by the caller to after activation


def incremental_plan(*, version: CartridgeVersion, config: ActiveConfiguration, refs: list[BlockRef], defer_full: bool = False) -> GatePlan:
    """Find the passing evaluation that verified the longest run of this version's leading blocks (committable.py's docstring)."""
    if (config.dtype, config.quant) != ("f32", "none"):
        return GatePlan(reason=f"{config.dtype}/{config.quant} is gated in full (divergence from f32 needs the whole log)")
    if not refs:
        return GatePlan(reason="the cartridge has no full block")
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
    best = GatePlan(reason="no earlier version of the scope that passed the gate under the active configuration shares its first block")
    mine = block_rows(version)
    for evaluation in candidates[:MAX_PARENT_CANDIDATES]:
        verified = evaluation.figures.get("verified_blocks") or []
        num = 0
        while num < min(len(verified), len(mine)) and verified[num] == mine[num]:
            num += 1
        if num > best.num_verified_blocks:
            best = GatePlan(parent=evaluation, num_verified_blocks=num)
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
        return GatePlan(reason=f"scheduled: every {conf.gate_full_every()}th version of an incremental chain runs the full gate")
    return best


def incremental_checks(*, version: CartridgeVersion, backend, config, plan: GatePlan, result: GateResult) -> None:
    """Checks (a)-(d) of the incremental gate (committable.py's docstring)."""
    loaded = version_loaded(version=version, backend=backend, config=config, result=result)
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
    accuracy_record(version=version, cases=cases, num_cases_erased=num_cases_erased, correct=correct, ttft=ttft, result=result)
