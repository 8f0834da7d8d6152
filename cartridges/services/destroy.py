"""Destruction of a version or a block: the blob and its key are deleted, the row stays with a record of why.

Erasure (services/erase.py), retention (services/retention.py) and an operator's destruction call these; what
outlives a destruction forgets what it digested (a destroyed block's id and digests are blanked, an erasure
blanks the version's digests).
"""
from __future__ import annotations

import logging

from django.db import IntegrityError, transaction

from core.errors import MnesioError
from memories.models import ErasureRequest

from .. import engine
from ..models import (
    CartridgeBlock,
    CartridgeBlockDestruction,
    CartridgeDestruction,
    CartridgeVersion,
    CartridgeVersionBlock,
)
from ..storage import blob_destroy

log = logging.getLogger("cartridges")


def cartridge_destroy(
    *, version: CartridgeVersion, reason: str, erasure_request: ErasureRequest | None = None, actor=None,
    from_block: int | None = None,
) -> CartridgeDestruction:
    """Delete the version's own blob and key and its blocks, and record why; the rows stay. Safe to run twice.

    ``from_block`` (an erasure): every block of the version from that index on is destroyed, shared or not; the
    blocks before it hold no erased token and stay (other versions use them). None (an operator's reason):
    the blocks no other live version uses are destroyed, the shared ones stay.
    """
    if not isinstance(reason, str) or not reason.strip():
        raise MnesioError("`reason` has to be non-empty text", extra={"field": "reason"})
    blob_destroy(storage_name=version.storage_name)
    links = list(CartridgeVersionBlock.objects.filter(version=version).select_related("block").order_by("index"))
    if from_block is None:
        shared = set(
            CartridgeVersionBlock.objects.filter(block__in=[link.block for link in links])
            .exclude(version=version)
            .filter(version__destruction__isnull=True, version__prune__isnull=True)
            .values_list("block_id", flat=True)
        )
        targets = [link.block for link in links if link.block.pk not in shared]
    else:
        targets = [link.block for link in links if link.index >= from_block]
    for block in targets:
        block_destroy(block=block, reason=reason, erasure_request=erasure_request)
    engine.cartridge_forget(version_id=version.pk)
    if erasure_request is not None:
        # the version digest commits to every block id and the tail's KV, the payload digest to every part's
        # tensors: both are functions of the erased text (an operator's destruction keeps them for cartridge_rebuild)
        CartridgeVersion.objects.filter(pk=version.pk).exclude(sha256="", payload_sha256="")._privileged_update(
            sha256="", payload_sha256=""
        )
    existing = CartridgeDestruction.objects.filter(version=version).first()
    if existing is not None:
        return existing
    try:
        with transaction.atomic():
            destruction = CartridgeDestruction.objects.create(
                version=version, erasure_request=erasure_request, reason=reason.strip()[:500], actor=actor
            )
    except IntegrityError:  # a concurrent run recorded it first
        return CartridgeDestruction.objects.get(version=version)
    log.info(
        "cartridge destroyed version=%s blocks_destroyed=%d erasure_request=%s",
        version.pk, len(targets), getattr(erasure_request, "pk", None),
    )
    return destruction


def block_destroy(*, block: CartridgeBlock, reason: str, erasure_request: ErasureRequest | None = None) -> None:
    """Delete a block's blob and key, blank its id and digests, and record it (the row stays); safe to run twice.

    The id and the part's digests are functions of the token ids up to the block's end: kept after the bytes are
    gone they would let whoever holds the scope's block secret test a guess of erased text.
    """
    blob_destroy(storage_name=block.storage_name)
    CartridgeBlock.objects.filter(pk=block.pk).exclude(block_id="", part_sha256="", sha256="")._privileged_update(
        block_id="", part_sha256="", sha256=""
    )
    try:
        with transaction.atomic():
            CartridgeBlockDestruction.objects.get_or_create(
                block=block, defaults={"reason": reason.strip()[:500], "erasure_request": erasure_request}
            )
    except IntegrityError:  # a concurrent run recorded it first
        pass
