"""Cartridge blobs in tests: list them, tamper with one, share a block-id secret between scopes."""
from __future__ import annotations


def stored_files(root) -> list:
    """Every blob file under the storage root."""
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def share_block_secret(*, source, target) -> None:
    """Give ``target`` (before its first compile) the block-id secret of ``source``: the two scopes' block ids, and so
    their cartridges' bytes, are then equal for equal logs (by design they differ between scopes)."""
    from cartridges.models import ScopeBlockSecret
    from cartridges.services.blocksecret import block_secret_aad, scope_block_secret
    from memories import crypto

    wrapped, wrapped_by = crypto.wrap(scope_block_secret(scope=source), aad=block_secret_aad(target.pk))
    ScopeBlockSecret.objects.create(scope=target, wrapped_key=wrapped, wrapped_by=wrapped_by)


def tamper(version) -> None:
    """Flip one byte of a version's stored blob in place (the gate must refuse it)."""
    from cartridges.storage import blob_storage

    path = blob_storage().path(version.storage_name)
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))
