"""Cartridge blobs at rest: through Django's storage API (STORAGES["cartridges"]), each one encrypted
with a blob key of its own (AES-256-GCM), the blob key wrapped by the master key (memories.crypto).

Stored layout: ``MAGIC | nonce (12) | ciphertext+tag``; the associated data binds the ciphertext to its
storage name, so a blob copied under another name fails to open. Destroying a blob deletes the file AND
its wrapped key (the CartridgeBlob row): a copy of the ciphertext left in a backup can never be opened.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.core.files.base import ContentFile
from django.core.files.storage import Storage, storages
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict, MnesioError
from memories import crypto

from .models import CartridgeBlob, CartridgeVersion

log = logging.getLogger("cartridges")

MAGIC = b"MNKB1\n"  # "mnesio key-wrapped blob", format 1


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
def blob_reserve(*, scope) -> tuple[CartridgeBlob, bytes]:
    """Record a fresh blob key under a new storage name before anything is written (see CartridgeBlob)."""
    name = f"scope-{scope.pk}/{uuid.uuid4().hex}.kvc"
    key = crypto.new_data_key()
    wrapped, wrapped_by = crypto.wrap(key, aad=_key_aad(name))
    row = CartridgeBlob.objects.create(storage_name=name, scope=scope, wrapped_key=wrapped, wrapped_by=wrapped_by)
    return row, key


@sensitive_variables()
def blob_write(*, blob: CartridgeBlob, key: bytes, data: bytes) -> StoredBlob:
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
    """Return the cartridge file of ``version`` after checking stored digest, GCM tag and file sha256."""
    try:
        blob = CartridgeBlob.objects.get(storage_name=version.storage_name)
    except CartridgeBlob.DoesNotExist:
        raise BlobUnavailable(
            f"the blob key of cartridge version {version.pk} is destroyed; the version cannot be served or opened",
            extra={"version": version.pk},
        ) from None
    storage = blob_storage()
    try:
        with storage.open(version.storage_name, "rb") as fh:
            stored = fh.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise BlobUnavailable(
            f"the blob of cartridge version {version.pk} is missing from storage; rebuild it with "
            f"`manage.py cartridge_rebuild {version.pk}`",
            extra={"version": version.pk},
        ) from None
    except OSError as exc:
        # the storage itself failed (an S3 outage, a permission): the blob may be fine, so retry, not rebuild
        raise _unavailable(exc, doing=f"reading the blob of cartridge version {version.pk}") from exc
    if hashlib.sha256(stored).hexdigest() != version.stored_sha256:
        raise BlobTampered(
            f"the stored blob of cartridge version {version.pk} does not match its recorded sha256; refusing it",
            extra={"version": version.pk, "check": "stored_sha256"},
        )
    if not stored.startswith(MAGIC) or len(stored) < len(MAGIC) + crypto.NONCE_BYTES + 16:
        raise BlobTampered(f"the stored blob of cartridge version {version.pk} is not a mnesio blob", extra={"version": version.pk})
    body = stored[len(MAGIC) :]
    try:
        key = crypto.unwrap(bytes(blob.wrapped_key), wrapped_by=blob.wrapped_by, aad=_key_aad(version.storage_name))
        data = crypto.open_box(key, body, aad=_blob_aad(version.storage_name))
    except crypto.InvalidTag:
        raise BlobTampered(
            f"the blob of cartridge version {version.pk} fails authentication; refusing it",
            extra={"version": version.pk, "check": "aes-gcm tag"},
        ) from None
    if hashlib.sha256(data).hexdigest() != version.sha256:
        raise BlobTampered(
            f"the cartridge file of version {version.pk} does not match its recorded sha256; refusing it",
            extra={"version": version.pk, "check": "sha256"},
        )
    return data


def blob_destroy(*, storage_name: str) -> bool:
    """Delete the stored blob and its key; True when anything was there. Safe to run twice."""
    storage = blob_storage()
    existed = False
    try:
        if storage.exists(storage_name):
            storage.delete(storage_name)
            existed = True
    except OSError as exc:
        # never report a blob destroyed that is still stored: the caller (an erasure) fails and is retried
        raise _unavailable(exc, doing=f"deleting blob {storage_name}") from exc
    deleted, _ = CartridgeBlob.objects.filter(storage_name=storage_name).delete()
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
    dead = list(
        CartridgeBlob.objects.filter(created_at__lte=cutoff).exclude(storage_name__in=claimed).values_list("storage_name", flat=True)
    )
    for name in dead:
        blob_destroy(storage_name=name)
    if dead:
        log.info("swept %d unclaimed cartridge blobs", len(dead))
    return dead


def blob_key_aad(row: CartridgeBlob) -> bytes:
    """Associated data of a blob key row (the keyring re-wraps and verifies blob keys with it)."""
    return _key_aad(row.storage_name)


def blob_keys_rewrap() -> int:
    """Re-wrap every blob key with the current master key (``rotate_master_key`` does it with all other keys).

    Keys wrapped by ``MNESIO_MASTER_KEY_OLD`` are unwrapped with it; blobs are not touched. The loop is the
    keyring's one re-wrap loop (each key in its own transaction under a row lock: re-run after an interruption).
    Returns how many keys were re-wrapped.
    """
    from memories.keyring import holder_rewrap, key_holders

    holder = next(h for h in key_holders() if h.label == CartridgeBlob._meta.label)
    num = holder_rewrap(holder)
    log.info("cartridge blob keys re-wrapped=%d", num)
    return num
