"""Erase by recompile: the view rebuilder registered with memories.registry.

After memories shreds a key it calls ``cartridge_views_rebuild(erasure_request)``: every version (and every
block from the first one an erased memory reaches) that held an erased memory is destroyed, then any
version sharing a destroyed block; every scope whose serving version was destroyed is compiled again at
its log head, gated and activated. Failures are raised after all destruction is done; running twice is
safe. What outlives a destruction keeps no digest of erased text.

Design, and why the rebuilt blob equals one from a log that never held the subject: docs/design/erasure.md.
"""
from __future__ import annotations

import logging
from collections import defaultdict

from core.errors import Conflict, MnesioError
from memories.models import ErasureKind, ErasureRequest, Memory, Subject
from memories.selectors import erasure_request_memories, erasure_request_subjects

from ..models import (
    BlobKey,
    CartridgeActivation,
    CartridgeVersion,
    CartridgeVersionBlock,
)
from ..storage import blob_destroy
from .activate import cartridge_activate
from .blocksecret import scope_block_secret_shred
from .compile import cartridge_compile
from .destroy import cartridge_destroy
from .errors import NothingToCompile
from .forget import answer_requests_discard, evaluation_cases_forget
from .routed_chunks import routed_chunks_destroy

log = logging.getLogger("cartridges")


def first_block_reached(*, version: CartridgeVersion, seqs: set[int]) -> int:
    """The index of the first block of ``version`` that any memory in ``seqs`` reaches (0 when it cannot tell)."""
    entries = version.manifest.get("entries", [])
    positions = version.entry_positions or []
    if not version.block_size or len(positions) != len(entries):
        return 0
    reached = [positions[i] for i, entry in enumerate(entries) if entry[0] in seqs]
    return min(reached) // version.block_size if reached else 0


def _serving_version_id(scope_id: int) -> int | None:
    activation = CartridgeActivation.objects.filter(scope_id=scope_id).order_by("-created_at", "-id").first()
    return activation.version_id if activation else None


def versions_holding(*, subjects: list[Subject] | None = None, memories=None) -> list[CartridgeVersion]:
    """Every version whose manifest lists a memory of ``subjects`` (or one of the ``memories`` rows), destroyed
    ones included.

    Decided from the protected rows alone: the memories' seqs (append-only log rows) against each
    version's manifest (an append-only version row), never from an index table that could be emptied.
    """
    if memories is None:
        memories = Memory.objects.filter(subject__in=subjects or [])
    seqs_by_scope: dict[int, set[int]] = defaultdict(set)
    for seq, scope_id in memories.values_list("seq", "scope_id"):
        seqs_by_scope[scope_id].add(seq)
    found = []
    rows = CartridgeVersion.objects.filter(scope_id__in=list(seqs_by_scope)).select_related("scope").order_by("id")
    for version in rows:
        held = seqs_by_scope[version.scope_id]
        if any(entry[0] in held for entry in version.manifest.get("entries", [])):
            found.append(version)
    return found


def cartridge_views_rebuild(erasure_request: ErasureRequest) -> None:
    """Destroy every cartridge holding the erased subjects, then recompile, gate and activate their scopes.

    First the derived copies that are not cartridges: the evaluation cases about what was erased (linked to an
    erased subject, quoting a forgotten memory, or of a deleted scope) are forgotten (their keys destroyed) and
    the pending answer requests of the scopes holding erased memories are discarded, so no rebuild gates with
    them and nothing sealed outlives the erasure. A deleted scope's remaining blobs are destroyed too.
    """
    subjects = erasure_request_subjects(erasure_request=erasure_request)
    erased = erasure_request_memories(erasure_request=erasure_request)
    deleted_scope_ids = [erasure_request.scope_id] if erasure_request.kind == ErasureKind.SCOPE else []
    evaluation_cases_forget(
        subject_ids=[subject.pk for subject in subjects],
        memory_seqs=[erasure_request.memory_id] if erasure_request.kind == ErasureKind.MEMORY else [],
        scope_ids=deleted_scope_ids,
    )
    answer_requests_discard(scope_ids=sorted(set(erased.values_list("scope_id", flat=True)) | set(deleted_scope_ids)))
    routed_chunks_destroy(erasure_request=erasure_request)  # the erased memories' chunks only: no other depends on them
    versions = versions_holding(memories=erased)
    # a deleted scope is not rebuilt: every cartridge of it is destroyed and none replaces it
    rebuild = erasure_request.kind != ErasureKind.SCOPE
    affected = {}
    seqs = set(erased.values_list("seq", flat=True))
    reason = f"erasure request #{erasure_request.pk}"
    for version in versions:
        if rebuild and _serving_version_id(version.scope_id) == version.pk:
            affected[version.scope_id] = version.scope
        cartridge_destroy(
            version=version, erasure_request=erasure_request, reason=reason, from_block=first_block_reached(version=version, seqs=seqs)
        )
    # a version that shares a destroyed block (the same tokens from another memory, e.g. a duplicate text) can no
    # longer be loaded: destroy it too (from that block on), and rebuild its scope if it served
    while True:
        sharing = (
            CartridgeVersionBlock.objects.filter(block__destruction__erasure_request=erasure_request, version__destruction__isnull=True)
            .select_related("version__scope")
            .order_by("version_id", "index")
        )
        first_index: dict[int, tuple[CartridgeVersion, int]] = {}
        for link in sharing:
            first_index.setdefault(link.version_id, (link.version, link.index))
        if not first_index:
            break
        for version, index in first_index.values():
            if rebuild and _serving_version_id(version.scope_id) == version.pk:
                affected[version.scope_id] = version.scope
            cartridge_destroy(version=version, erasure_request=erasure_request, reason=reason + " (shared block)", from_block=index)
            versions.append(version)
    # a deleted scope keeps no stored bytes at all: blobs no version row names (an unfinished compile's, a block
    # of a pruned chain) go too, not only those of the versions holding its memories
    for storage_name in BlobKey.objects.filter(scope_id__in=deleted_scope_ids).values_list("storage_name", flat=True):
        blob_destroy(storage_name=storage_name)
    for scope_id in deleted_scope_ids:  # every block id of the scope becomes a keyed hash under a key nobody has
        scope_block_secret_shred(scope_id=scope_id)
    failures = []
    for scope in affected.values():
        try:
            version = cartridge_compile(scope=scope)
            cartridge_activate(version=version, kind="erasure")
        except NothingToCompile:
            log.info("scope=%s has no surviving memories after erasure request=%s", scope.pk, erasure_request.pk)
        except MnesioError as exc:
            failures.append(f"scope '{scope.name}': {exc.message}")
    log.info(
        "erasure rebuild request=%s destroyed=%d rebuilt_scopes=%d failures=%d",
        erasure_request.pk, len(versions), len(affected) - len(failures), len(failures),
    )
    if failures:
        raise Conflict(
            f"every cartridge holding the subject is destroyed, but {len(failures)} scope(s) could not be rebuilt: "
            + "; ".join(failures),
            extra={"failures": failures},
        )
