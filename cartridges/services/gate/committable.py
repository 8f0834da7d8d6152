"""The gate: cartridge_is_committable() and the evaluations it records (this module); the checks live beside it
(checks.py, full.py, incremental.py).

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

from core.errors import MnesioError
from kvengine import CorruptCartridgeError
from kvengine.format import header_blocks, read_header, read_tail_part

from ... import engine
from ...models import CartridgeDestruction, CartridgeEvaluation, CartridgeVersion
from ...selectors import (
    active_configuration,
    evaluation_cases_digest,
    version_erased_subjects,
)
from ...storage import BlobTampered, BlobUnavailable, version_parts_read
from ..compile import key_digest
from .checks import GateResult
from .full import full_checks
from .incremental import GatePlan, block_rows, incremental_checks, incremental_plan

GATES = ("full", "auto")  # what a caller asks for; "auto" runs the incremental gate when it applies


def cartridge_is_committable(*, version: CartridgeVersion, model_checks: bool = True, gate: str = "full", defer_full: bool = False) -> GateResult:
    """Run the gate over ``version``; ``model_checks=False`` runs only the cheap checks (1-4), no model work.

    ``gate="auto"`` runs the incremental gate when its conditions hold (docs/design/gate.md), else the full one.
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
    plan = incremental_plan(version=version, config=config, refs=refs, defer_full=defer_full) if gate == "auto" else GatePlan(reason="asked for the full gate")
    started = time.perf_counter()
    if plan.parent is None:
        full_checks(version=version, backend=backend, config=config, result=result)
        tokens = (result.figures.get("fidelity", {}).get("num_probes", 0) + result.figures.get("accuracy", {}).get("num_cases", 0)) * version.num_tokens
        result.figures["gate"] = "full"
        result.figures["gate_cost"] = {"seconds": round(time.perf_counter() - started, 3), "tokens_reread": tokens, "why_full": plan.reason}
    else:
        incremental_checks(version=version, backend=backend, config=config, plan=plan, result=result)
        result.figures["gate"] = "incremental"
        result.figures["gate_cost"] = {
            "seconds": round(time.perf_counter() - started, 3),
            "tokens_reread": (result.figures.get("incremental") or {}).get("num_new_tokens", 0),
        }
    # what this evaluation vouches for, when it passes: every block of the version (a later version's parent)
    # by block row: an id or digest here would outlive the block's destruction in an immutable row (services/destroy.py)
    result.figures["verified_blocks"] = block_rows(version)
    return result


def _finish(result: GateResult, model_checks: bool) -> GateResult:
    if model_checks and not result.passed:
        result.figures["model_checks"] = "skipped: the checks above failed"
    return result


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

