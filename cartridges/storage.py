"""Cartridge blobs at rest: through Django's storage API (STORAGES["cartridges"]), each one encrypted
with a blob key of its own (AES-256-GCM), the blob key wrapped by the master key (memories.crypto).

A version is stored by parts (kvengine/blocks.py): the version's own blob is its tail part (the header,
which lists every block with its digest, and the tail's tensors); each block is a blob of its own, stored once per
scope (CartridgeBlock) and referenced by every version that uses it (CartridgeVersionBlock). A version is
readable while its tail key and every one of its blocks' keys exist. Decrypted, verified block parts are kept in
a per-process LRU (MNESIO_BLOCK_CACHE_BYTES) keyed by storage name; a read still checks in the database that the
block's key exists, so a destroyed block is never served from the cache, and every request and task first drops the
parts whose key is gone (engine.cartridges_purge_destroyed), so none outlives its destruction in memory.

Stored layout: ``MAGIC | nonce (12) | ciphertext+tag``; the associated data binds the ciphertext to its
storage name, so a blob copied under another name fails to open. Destroying a blob deletes the file AND
its wrapped key (the BlobKey row): a copy of the ciphertext left in a backup can never be opened.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict, MnesioError
from kvengine import CorruptCartridgeError
from kvengine.blocks import TrustedPart
from kvengine.format import join_tensors, read_block_part, read_tail_part, write_cartridge
from memories import crypto

from .models import BlobKey, CartridgeBlock, CartridgePrune, CartridgeVersion, CartridgeVersionBlock

log = logging.getLogger("cartridges")

MAGIC = b"MNKB1\n"  # "mnesio key-wrapped blob", layout version 1


class BlobUnavailable(Conflict):
    """The blob of a version is gone (destroyed, or lost from storage)."""


class BlobTampered(Conflict):
    """The stored bytes of a version do not match what was recorded: never served."""


class BlobStorageUnavailable(MnesioError):
    """Blob storage refused a write (disk full, unwritable, a storage service down): retry once it is fixed."""

    status_code = 503


def _unavailable(exc: OSError, *, doing: str) -> BlobStorageUnavailable:
    """The 503 for a storage failure other than a missing blob, naming the errno and what was being done."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else None
    log.warning("blob storage failed while %s errno=%s: %s", doing, code, exc)
    return BlobStorageUnavailable(
        f"blob storage unavailable while {doing}: {exc.strerror or type(exc).__name__}; retry once the storage "
        "(MNESIO_BLOB_ROOT, MNESIO_BLOB_STORAGE or MNESIO_BLOB_STORAGE_BACKEND) answers",
        extra={"kind": "blob_storage_unavailable", "errno": code},
    )


@dataclass(frozen=True)
class StoredBlob:
    """Where a blob was written and the digest of the bytes as stored (ciphertext)."""

    name: str
    stored_sha256: str
    stored_size_bytes: int


def blob_storage() -> Storage:
    """The storage backend cartridge blobs live in (local files by default; S3 etc. via django-storages)."""
    return storages["cartridges"]


def _blob_aad(name: str) -> bytes:
    return b"mnesio:cartridge-blob:v1|" + name.encode()


def _key_aad(name: str) -> bytes:
    return b"mnesio:cartridge-blob-key:v1|" + name.encode()


@sensitive_variables()
def blob_reserve(*, scope, suffix: str = "kvc") -> tuple[BlobKey, bytes]:
    """Record a fresh blob key under a new storage name before anything is written (see BlobKey).

    ``suffix``: "kvc" for a version's own blob, "kvb" for a block's."""
    name = f"scope-{scope.pk}/{uuid.uuid4().hex}.{suffix}"
    key = crypto.new_data_key()
    wrapped, wrapped_by = crypto.wrap(key, aad=_key_aad(name))
    row = BlobKey.objects.create(storage_name=name, scope=scope, wrapped_key=wrapped, wrapped_by=wrapped_by)
    return row, key


@sensitive_variables()
def blob_write(*, blob: BlobKey, key: bytes, data: bytes) -> StoredBlob:
    """Encrypt ``data`` with the blob key and store it under the reserved name."""
    stored = MAGIC + crypto.seal_box(key, data, aad=_blob_aad(blob.storage_name))
    try:
        saved = blob_storage().save(blob.storage_name, ContentFile(stored))
    except OSError as exc:
        # the caller (cartridges.services.compile._version_store) deletes any half-written bytes and the key row
        code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else None
        log.warning("blob storage write failed name=%s errno=%s: %s", blob.storage_name, code, exc)
        raise BlobStorageUnavailable(
            f"blob storage unavailable: {exc.strerror or type(exc).__name__}; the cartridge was not stored, "
            "retry the compile once the storage (MNESIO_BLOB_ROOT or MNESIO_BLOB_STORAGE_BACKEND) accepts writes",
            extra={"kind": "blob_storage_unavailable", "errno": code},
        ) from exc
    if saved != blob.storage_name:
        # the storage renamed it (a file already had that name): never point a row at someone else's bytes
        blob_storage().delete(saved)
        raise Conflict(f"blob storage stored {blob.storage_name!r} as {saved!r}; refusing a renamed blob")
    return StoredBlob(name=saved, stored_sha256=hashlib.sha256(stored).hexdigest(), stored_size_bytes=len(stored))


@sensitive_variables()
def blob_read(*, version: CartridgeVersion) -> bytes:
    """Return the whole cartridge file of ``version`` (assembled from its parts), every digest checked."""
    tail, blocks = version_parts_read(version=version)
    if not version.block_size and not blocks:
        return tail  # a version stored whole: one file, no block parts
    try:
        header, refs, tail_tensors = read_tail_part(tail)
        compat = header.compat_key()
        parts = [
            read_block_part(blocks[ref.block_id], block_id=ref.block_id, first_position=ref.first_position, num_tokens=ref.num_tokens,
                            compat_key=compat, sha256=ref.sha256)[1]
            for ref in refs
        ]
    except (CorruptCartridgeError, KeyError) as exc:
        raise BlobTampered(f"the parts of cartridge version {version.pk} do not fit together: {exc}", extra={"version": version.pk}) from None
    return write_cartridge(header, join_tensors(parts, tail_tensors))


def version_parts_read(*, version: CartridgeVersion) -> tuple[bytes, dict[str, bytes]]:
    """The tail part of ``version`` and its blocks' parts by block id, each one's stored digest, GCM tag and sha256
    checked (block parts from this process's cache when it holds them)."""
    tail = _tail_read(version=version)
    links = list(CartridgeVersionBlock.objects.filter(version=version).select_related("block").order_by("index"))
    keys = {row.storage_name: row for row in BlobKey.objects.filter(storage_name__in=[link.block.storage_name for link in links])}
    blocks = {}
    for link in links:
        if link.block.scope_id != version.scope_id:  # compile links only the scope's own blocks; a row inserted by hand
            raise BlobTampered(
                f"block {link.index} of cartridge version {version.pk} belongs to another scope; the version is refused",
                extra={"version": version.pk, "block": link.index},
            )
        key_row = keys.get(link.block.storage_name)
        if key_row is None:
            raise BlobUnavailable(
                f"block {link.index} of cartridge version {version.pk} is destroyed{_pruned(version)}; the version cannot be served or opened",
                extra={"version": version.pk, "block": link.index},
            )
        blocks[link.block.block_id] = block_read(block=link.block, key_row=key_row)
    return tail, blocks


def _pruned(version: CartridgeVersion) -> str:
    prune = CartridgePrune.objects.filter(version=version).first()
    return f" (pruned by retention, keep_previous_versions={prune.keep_previous_versions})" if prune else ""


_block_cache: OrderedDict[str, bytes] = OrderedDict()
_block_cache_lock = threading.Lock()
_block_cache_bytes = [0]


def _block_cache_limit() -> int:
    from django.conf import settings

    return int(settings.MNESIO_BLOCK_CACHE_BYTES)


def block_read(*, block: CartridgeBlock, key_row: BlobKey) -> bytes:
    """A live block's verified part bytes (``key_row`` is its key, fetched by the caller: the block is live)."""
    with _block_cache_lock:
        data = _block_cache.get(block.storage_name)
        if data is not None:
            _block_cache.move_to_end(block.storage_name)
            return data
    data = _blob_open(
        name=block.storage_name, key_row=key_row, stored_sha256=block.stored_sha256, sha256=block.sha256, what=f"block {block.block_id[:12]}"
    )
    limit = _block_cache_limit()
    if len(data) <= limit:
        with _block_cache_lock:
            if block.storage_name not in _block_cache:
                _block_cache[block.storage_name] = data
                _block_cache_bytes[0] += len(data)
            while _block_cache_bytes[0] > limit and _block_cache:
                _, dropped = _block_cache.popitem(last=False)
                _block_cache_bytes[0] -= len(dropped)
    return data


def block_cache_names() -> list[str]:
    """The storage names of the block parts this process's cache holds."""
    with _block_cache_lock:
        return list(_block_cache)


def block_cache_drop(storage_names: list[str] | None = None) -> None:
    """Drop blocks from this process's cache (all when None)."""
    with _block_cache_lock:
        for name in list(_block_cache) if storage_names is None else storage_names:
            data = _block_cache.pop(name, None)
            if data is not None:
                _block_cache_bytes[0] -= len(data)


def scope_blocks_live(*, scope) -> dict[str, tuple[CartridgeBlock, BlobKey]]:
    """The scope's live blocks by block id (the oldest row when a race stored one twice), with their key rows."""
    rows = list(CartridgeBlock.objects.filter(scope=scope).order_by("id"))
    keys = {row.storage_name: row for row in BlobKey.objects.filter(scope=scope, storage_name__in=[b.storage_name for b in rows])}
    live: dict[str, tuple[CartridgeBlock, BlobKey]] = {}
    for row in rows:
        if row.storage_name in keys and row.block_id not in live:
            live[row.block_id] = (row, keys[row.storage_name])
    return live


def block_lookup(*, scope, live: dict[str, tuple[CartridgeBlock, BlobKey]]):
    """A kvengine BlockLookup over ``live`` (scope_blocks_live's answer): each block read and verified when asked.

    block_read checks the stored bytes' sha256, the GCM tag and the sha256 of the part file recorded when compile
    wrote it, so the part is handed over as a kvengine TrustedPart (its tensors are not hashed a second time)."""

    def lookup(block_id: str) -> TrustedPart | None:
        found = live.get(block_id)
        if found is None:
            return None
        try:
            return TrustedPart(block_read(block=found[0], key_row=found[1]))
        except (BlobUnavailable, BlobTampered):
            log.warning("stored block %s of scope %s is unreadable; computing it again", block_id[:12], scope.pk)
            return None

    return lookup


def _tail_read(*, version: CartridgeVersion) -> bytes:
    try:
        blob = BlobKey.objects.get(storage_name=version.storage_name)
    except BlobKey.DoesNotExist:
        raise BlobUnavailable(
            f"the blob key of cartridge version {version.pk} is destroyed{_pruned(version)}; the version cannot be served or opened",
            extra={"version": version.pk},
        ) from None
    return _blob_open(name=version.storage_name, key_row=blob, stored_sha256=version.stored_sha256, sha256=version.sha256, what=f"cartridge version {version.pk}", version=version)


@sensitive_variables()
def _blob_open(*, name: str, key_row: BlobKey, stored_sha256: str, sha256: str, what: str, version: CartridgeVersion | None = None) -> bytes:
    """Read a stored blob and check its stored sha256, GCM tag and plaintext sha256."""
    blob = key_row
    ident = {"version": version.pk} if version is not None else {"blob": name}
    storage = blob_storage()
    try:
        with storage.open(name, "rb") as fh:
            stored = fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        rebuild = f"; rebuild it with `manage.py cartridge_rebuild {version.pk}`" if version is not None else "; recompile the scope"
        raise BlobUnavailable(f"the blob of {what} is missing from storage{rebuild}", extra=ident) from None
    except OSError as exc:
        # the storage itself failed (an S3 outage, a permission): the blob may be fine, so retry, not rebuild
        raise _unavailable(exc, doing=f"reading the blob of {what}") from exc
    if hashlib.sha256(stored).hexdigest() != stored_sha256:
        raise BlobTampered(f"the stored blob of {what} does not match its recorded sha256; refusing it", extra={**ident, "check": "stored_sha256"})
    if not stored.startswith(MAGIC) or len(stored) < len(MAGIC) + crypto.NONCE_BYTES + 16:
        raise BlobTampered(f"the stored blob of {what} is not a mnesio blob", extra=ident)
    body = stored[len(MAGIC) :]
    try:
        key = crypto.unwrap(bytes(blob.wrapped_key), wrapped_by=blob.wrapped_by, aad=_key_aad(name))
        data = crypto.open_box(key, body, aad=_blob_aad(name))
    except crypto.InvalidTag:
        raise BlobTampered(f"the blob of {what} fails authentication; refusing it", extra={**ident, "check": "aes-gcm tag"}) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        label = f"the cartridge file of version {version.pk}" if version is not None else f"the part of {what}"
        raise BlobTampered(f"{label} does not match its recorded sha256; refusing it", extra={**ident, "check": "sha256"})
    return data


def blob_destroy(*, storage_name: str) -> bool:
    """Delete the stored blob and its key; True when anything was there. Safe to run twice."""
    storage = blob_storage()
    existed = False
    try:
        existed = storage.exists(storage_name)
        # delete whatever exists() says: in a versioned bucket a first attempt that wrote the delete marker and
        # then failed makes the key look absent while its old versions are still stored (cartridges.s3.delete)
        storage.delete(storage_name)
    except NotADirectoryError:  # a local path through a file: nothing can be stored there
        pass
    except OSError as exc:
        # never report a blob destroyed that is still stored: the caller (an erasure) fails and is retried
        raise _unavailable(exc, doing=f"deleting blob {storage_name}") from exc
    deleted, _ = BlobKey.objects.filter(storage_name=storage_name).delete()
    block_cache_drop([storage_name])
    return existed or bool(deleted)


PROBE_PREFIX = "readiness-probes"


def blob_storage_check() -> None:
    """Write, read back and delete a small probe object; raise BlobStorageUnavailable when any step fails.

    For readiness checks: a storage that answers but cannot be written (a full disk, a read-only bucket policy,
    wrong credentials) is not ready to store cartridges. The probe holds no secret.
    """
    storage = blob_storage()
    name = f"{PROBE_PREFIX}/{uuid.uuid4().hex}.probe"
    payload = b"mnesio blob storage probe\n"
    try:
        saved = storage.save(name, ContentFile(payload))
        try:
            with storage.open(saved, "rb") as fh:
                if fh.read() != payload:
                    raise OSError(errno.EIO, "the probe object read back differs from what was written")
        finally:
            storage.delete(saved)
    except OSError as exc:
        raise _unavailable(exc, doing="checking it with a probe object") from exc


def blob_exists(*, storage_name: str) -> bool:
    """Whether bytes are stored under ``storage_name`` (tests and the dashboard use it)."""
    return blob_storage().exists(storage_name)


def blobs_sweep(*, older_than_s: int) -> list[str]:
    """Destroy reserved blobs that never got a version row and are older than ``older_than_s``.

    A compile killed between writing its blob and committing its row (kill -9, OOM) leaves such a blob;
    no compile can still be running after the task's hard time limit, so anything older is dead.
    """
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    claimed = CartridgeVersion.objects.values("storage_name")
    claimed_by_blocks = CartridgeBlock.objects.values("storage_name")
    dead = list(
        BlobKey.objects.filter(created_at__lte=cutoff)
        .exclude(storage_name__in=claimed)
        .exclude(storage_name__in=claimed_by_blocks)
        .values_list("storage_name", flat=True)
    )
    for name in dead:
        blob_destroy(storage_name=name)
    if dead:
        log.info("swept %d unclaimed cartridge blobs", len(dead))
    return dead


def blob_key_aad(row: BlobKey) -> bytes:
    """Associated data of a blob key row (the keyring re-wraps and verifies blob keys with it)."""
    return _key_aad(row.storage_name)


def blob_keys_rewrap() -> int:
    """Re-wrap every blob key with the current master key (``rotate_master_key`` does it with all other keys).

    Keys wrapped by ``MNESIO_MASTER_KEY_OLD`` are unwrapped with it; blobs are not touched. The loop is the
    keyring's one re-wrap loop (each key in its own transaction under a row lock: re-run after an interruption).
    Returns how many keys were re-wrapped.
    """
    from memories.keyring import holder_rewrap, key_holders

    holder = next(h for h in key_holders() if h.label == BlobKey._meta.label)
    num = holder_rewrap(holder)
    log.info("cartridge blob keys re-wrapped=%d", num)
    return num
