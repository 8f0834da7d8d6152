"""Block cartridges in tests: fill a scope with numbered facts, read a version's block links, and check that the
block rows and the blob store agree."""
from __future__ import annotations

from pathlib import Path

from tests.support.blobs import stored_files


def fill_facts(scope, append, num, *, start=0):
    """Append ``num`` numbered facts; return the last memory (its seq is a head to compile at)."""
    last = None
    for i in range(start, start + num):
        last = append(scope, f"Fact {i}: the locker number {i} holds item {i * 7}.")
    return last


def version_links(version) -> list:
    """The version's block links in order, each with its block."""
    from cartridges.models import CartridgeVersionBlock

    return list(CartridgeVersionBlock.objects.filter(version=version).select_related("block").order_by("index"))


def assert_blocks_consistent() -> None:
    """Rows and store agree: no orphan, no version missing a block, every live version opens.

    Every block is live (key row) or recorded destroyed, never both or neither; every key row is claimed by a
    version or a block; every stored file has a key row; every version neither destroyed nor pruned links only
    live blocks and its parts and whole file read back with every digest checked."""
    from django.conf import settings

    from cartridges.models import BlobKey, CartridgeBlock, CartridgeBlockDestruction, CartridgeVersion
    from cartridges.storage import blob_read, version_parts_read

    keys = set(BlobKey.objects.values_list("storage_name", flat=True))
    destroyed = set(CartridgeBlockDestruction.objects.values_list("block_id", flat=True))
    for block in CartridgeBlock.objects.all():
        assert (block.storage_name in keys) != (block.pk in destroyed), f"block {block.pk} is neither live nor recorded destroyed"
    claimed = set(CartridgeVersion.objects.values_list("storage_name", flat=True)) | set(
        CartridgeBlock.objects.values_list("storage_name", flat=True)
    )
    assert keys <= claimed, f"key rows no version or block claims: {keys - claimed}"
    root = Path(settings.STORAGES["cartridges"]["OPTIONS"]["location"])
    assert {str(p.relative_to(root)) for p in stored_files(root)} == keys
    live = CartridgeVersion.objects.filter(destruction__isnull=True, prune__isnull=True)
    for version in live:
        for link in version_links(version):
            assert link.block.storage_name in keys, f"live version {version.pk} links destroyed block {link.block_id}"
        tail, blocks = version_parts_read(version=version)
        assert tail and len(blocks) == len(version_links(version))
        assert blob_read(version=version)
