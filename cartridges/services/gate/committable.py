"""The gate: is_committable() and the evaluations it records (this module); the checks live beside it
(checks.py, full.py, incremental.py).

Checks, in order (every failing one is a reason; the model checks run only when the cheap ones pass,
because they need a loadable cartridge and the version's texts):
1. not destroyed;
2. compiled under the active configuration, and its compatibility key equals the active backend's
   (model, weights, tokenizer, template, rope, dtype, quant);
3. no erased subject in the manifest;
4. blob intact: stored sha256, AES-GCM tag, file sha256, then kvengine's header check (payload sha256)
   and the header agrees with the row (key, head, token count);
5. fidelity: top-1 next-token agreement with re-reading the same memories as text, over probes made from
   the memories (``gate_num_auto_probes``, evenly spaced over the log) plus the scope's EvaluationCase
   questions, at or above ``MNESIO_GATE_MIN_FIDELITY``;
6. task accuracy on the EvaluationCases (an answer is correct when a normalized expected answer appears
   in the normalized answer): cartridge >= text re-reading - ``MNESIO_GATE_ACCURACY_TOLERANCE``; the
   BM25 top-k retrieval baseline (the k best memories re-read as text) is recorded beside it and is
   required too when ``MNESIO_GATE_REQUIRE_RETRIEVAL`` is on. With no cases the accuracy check has
   nothing to compare and passes (recorded as ``num_cases: 0``). Cases erased with a subject they concern
   are skipped and counted (``num_cases_erased``).
7. divergence, for a quantized or non-f32 configuration: the same probes are answered from an f32
   cartridge of the same memories (the reference), and their answers teacher-forced through the version's
   cartridge; the mean KL(f32 || variant) of the next-token distributions over every answer position must be
   at most ``MNESIO_GATE_MAX_MEAN_KL`` and the top-1 agreement per position at least
   ``MNESIO_GATE_MIN_TOP1_PER_POSITION`` (kvengine.divergence: the measure kveval and bench/kv_speed.py
   report). It catches a variant whose arithmetic or storage is broken even when its own cartridge and its
   own re-reading agree with each other (checks 5-6 compare a variant with itself).
Figures hold numbers only, never memory or question text.

Two gates: ``figures["gate"]`` says which ran, ``figures["gate_cost"]`` what it cost (seconds of model
checks and tokens re-read as text).

- **full**: checks 1-7 above. The probes compare with ONE re-reading of every memory as text, in one pass
  independent of compile (KvBackend.fidelity: each probe's answer is teacher-forced through it), and each case's
  text answer re-reads every memory with its question.
- **incremental** (``gate="auto"``, f32 only): for a block cartridge whose leading blocks are the very block rows
  (one row: one keyed id and part digest of the scope) that an earlier version of the same scope had verified, by a
  passing evaluation (full or incremental) made under the active configuration since it became active
  (``figures["verified_blocks"]``: row ids, never block ids or digests, which would outlive an erasure), of a
  version that never failed a full gate (a scheduled full gate that fails after an incremental pass withdraws it).
  Checks 1-4 as always; then, through ``KvBackend.verify_extension``, (a) the header's block ids are the chain of
  this version's own memories' token ids and its token count theirs; (b) the new part, from the first
  unverified block to the end, is re-read ONCE on top of the verified blocks and its KV compared position by
  position with the cartridge's (max abs difference at most ``MNESIO_GATE_MAX_KV_ABS_DIFF``); (c) fidelity on
  probes (the auto probes over the log plus one per NEW memory, up to ``gate_num_auto_probes``, plus the cases'
  questions): the cartridge's first token against that re-reading's, at the same threshold; (d) task accuracy on
  the cases: the cartridge's answers against the re-reading's (computed once for all probes and cases), and the
  BM25 retrieval baseline as in the full gate.

Why the incremental gate is as strong as the full gate for that version. Attention is causal, so what re-reading
the whole text computes for the first n tokens does not depend on what follows them; a full gate's text
re-reading of this version is exactly "the first n tokens read, then the rest on top". (a) proves the first n
tokens are the same token ids (chain ids hash every token id from position 0, the compatibility key and the
block size) as those of the blocks already verified, and the digests prove the cartridge holds for them the very
bytes that passed that earlier gate (compile is deterministic: a from-scratch compile produces the same bytes,
so a full gate would test those same bytes against the same tokens again). What can differ from the verified
state is only the new part, and (b) checks it more tightly than probes can: every layer, every position, keys
and values, against a recomputation by another code path (a plain cache, not compile's _BlockCache, part store and
payload assembly; in compile's chunks, each new block then the tail, since where a prefill is cut changes the
float sums and a right cartridge should equal its re-reading exactly, not to a tolerance). (c) and (d) still
compare answers end to end, on questions about the new memories too, so a
cartridge whose new part is wrong in a way the KV tolerance misses still fails on the answers it gives. The
reference each probe is compared with is the text re-reading with the verified prefix taken as proven, which
is what the full gate would re-read, to float reordering. The checks 1-4 are unchanged, so a tampered blob, an
erased subject or a foreign key fails as before.

When (b) finds the new part's KV equal to its re-reading bit for bit (``max_abs_diff == 0``: what a right f32
cartridge gives, the append filling only the tail or completing blocks alike), the cartridge and the re-reading
are the same state, so (c) and (d)
would only compare two code paths on it: the probes are not decoded (``figures["incremental"]["by_construction"]``
says so; fidelity is recorded as agreement 1, KL 0) and the cases are answered once, from the cartridge, for the
accuracy check and the retrieval baseline. That keeps the gate of such an append at the cost of one re-read of the
new part (bench/blocks_bench.py: decoding 8 probes both ways at 8k tokens took ~10x the incremental compile).
When the KV differs at all (another kernel, a nondeterministic backend, bytes that are wrong within the
tolerance), the probes run as above.

When the full gate still runs: on demand (``cartridge_evaluate`` defaults to it; the API's evaluate and
``manage.py`` commands use it); for every bf16 or quantized configuration (check 7 needs an f32 reference of the
whole log); after a configuration switch (only evaluations made since the active configuration became active
count, so the first version after a switch has no parent); when no parent is found (no blocks shared, a parent
that never passed, a parent that passed under another configuration); and on a schedule: every
``MNESIO_GATE_FULL_EVERY``-th version gated incrementally since the scope's newest passing full gate (default 10;
``figures["incremental"]["since_full"]`` counts them). An auto-refresh defers that scheduled full gate
(``defer_full``): the version is gated incrementally and activated, so a new memory is served within seconds, and the full gate then runs on the version
serving, off the refresh's path (services/refresh.py: ``scope_full_gate``); when it fails, the scope is rolled
back to the version that served before. The count runs on until a full gate passes, so a lost or refused
one is asked for again by the next refresh.
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


def cartridge_is_committable(*, version: CartridgeVersion, full: bool = True, gate: str = "full", defer_full: bool = False) -> GateResult:
    """Run the gate over ``version``; ``full=False`` runs only the cheap checks (1-4), no model work.

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
        return _finish(result, full)
    try:
        if not version.block_size and not blocks:
            header = read_header(tail)  # a version stored whole (before format 4)
        else:
            header, _, _ = read_tail_part(tail)
        refs = header_blocks(header)
        if any(ref.block_id not in blocks for ref in refs):
            raise CorruptCartridgeError("its header names blocks the version does not link")
    except CorruptCartridgeError as exc:
        result.fail(f"the cartridge file of version {version.pk} is corrupt: {exc}")
        return _finish(result, full)
    if key_digest(header.compat_key()) != version.key_digest or header.log_head != version.log_head or header.num_tokens != version.num_tokens:
        result.fail(f"the cartridge header of version {version.pk} disagrees with its version row (key, head or token count)")
    result.figures["blob"] = {"size_bytes": version.size_bytes, "intact": True}
    if not full or not result.passed:
        return _finish(result, full)
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


def _finish(result: GateResult, full: bool) -> GateResult:
    if full and not result.passed:
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


# The contract's name for the gate.
is_committable = cartridge_is_committable
