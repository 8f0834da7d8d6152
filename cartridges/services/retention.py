"""Retention: a scope keeps its active version and the ``keep_previous_versions`` before it restorable.

After every activation, versions of the scope older than the active one, beyond the newest
``keep_previous_versions`` of them that still exist, are pruned: the version's own blob and key are destroyed, and
so is every block of it that no remaining version (kept, or newer than the active one) uses; a CartridgePrune row
records it and the version row stays (its manifest and digests are history). The default keeps 3
(models.DEFAULT_KEEP_PREVIOUS_VERSIONS); ``None`` keeps every version. Rolling back to a pruned version is refused, naming the retention setting.

Races: a compile that reuses a block locks the block's key row and checks it still exists in the transaction
that links the block to its new version (services/compile.py); the prune locks the same key rows first and only
then reads which versions use the blocks, so a block is either linked by the new version (and kept) or destroyed
before the compile's check (and the compile runs again).
"""
from __future__ import annotations

import logging

from django.db import transaction

from ..models import BlobKey, CartridgePrune, CartridgeVersion, CartridgeVersionBlock
from ..selectors import latest_activation, scope_settings_get
from ..storage import blob_destroy
from .destroy import block_destroy

log = logging.getLogger("cartridges")


def versions_prune(*, scope) -> list[CartridgePrune]:
    """Prune the scope's versions beyond retention (module docstring); return the new prune records."""
    keep = scope_settings_get(scope=scope).keep_previous_versions
    activation = latest_activation(scope=scope)
    if keep is None or activation is None:
        return []
    older = CartridgeVersion.objects.filter(
        scope=scope, pk__lt=activation.version_id, destruction__isnull=True, prune__isnull=True
    ).order_by("-pk")
    records = [version_prune(version=version, keep=keep) for version in list(older)[keep:]]
    return [record for record in records if record is not None]


def version_prune(*, version: CartridgeVersion, keep: int) -> CartridgePrune | None:
    """Destroy ``version``'s blob and the blocks only it (and other pruned or destroyed versions) used."""
    links = list(CartridgeVersionBlock.objects.filter(version=version).select_related("block"))
    freed = 0
    num_destroyed = 0
    with transaction.atomic():
        if CartridgePrune.objects.filter(version=version).exists():
            return None
        names = [link.block.storage_name for link in links]
        # in storage_name order, as the compile locks them: an order left to the plan can deadlock with it
        live = set(
            BlobKey.objects.select_for_update().filter(storage_name__in=names).order_by("storage_name")
            .values_list("storage_name", flat=True)
        )
        used = set(
            CartridgeVersionBlock.objects.filter(block__in=[link.block for link in links])
            .exclude(version=version)
            .filter(version__destruction__isnull=True, version__prune__isnull=True)
            .values_list("block_id", flat=True)
        )
        for link in links:
            if link.block.pk in used or link.block.storage_name not in live:
                continue
            block_destroy(block=link.block, reason=f"pruned with version {version.pk} (keep_previous_versions={keep})")
            freed += link.block.stored_size_bytes
            num_destroyed += 1
        if blob_destroy(storage_name=version.storage_name):
            freed += version.stored_size_bytes
        record = CartridgePrune.objects.create(
            version=version, keep_previous_versions=keep, num_blocks_destroyed=num_destroyed, bytes_freed=freed
        )
    log.info("cartridge pruned version=%s scope=%s blocks_destroyed=%d bytes_freed=%d", version.pk, version.scope_id, num_destroyed, freed)
    return record
