"""Envelope encryption for the log: AES-256-GCM data keys wrapped by the master key.

Every memory is sealed with its own data key (memories.models.MemoryKey), wrapped by its subject's key,
or by its scope's key when it has no subject (memories appended before memories had own keys were sealed
with the subject's or scope's key directly). Subject and scope keys are stored only wrapped (encrypted) by
the master key, and each records the id of the master key that wrapped it, so ``rotate_master_key`` can
re-wrap them without touching a single memory row, nor a memory's own key (wrapped by a data key, not by
the master key, so a rotation does not have to touch one row per memory). Forgetting one memory shreds its
own key; erasing a subject shreds the subject's key, and with it every own key it wraps. Own keys are
random, not derived: no KDF runs per memory, one AES-GCM wrap does. Associated data binds every ciphertext to where it lives
(a memory to its seq, scope and subject; a wrapped key to its owner), so bytes copied elsewhere
fail authentication instead of decrypting.
"""
from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.views.decorators.debug import sensitive_variables

from core.keys import MasterKeyUnavailable  # defined in core so its handler (core.errors) never imports memories

NONCE_BYTES = 12  # the GCM standard nonce size; random per encryption (2^-32 collision bound is far off)
KEY_BYTES = 32  # AES-256

__all__ = ["InvalidTag", "NONCE_BYTES", "KEY_BYTES", "MasterKeyUnavailable"]


class WrapGuard(NamedTuple):
    """What runs around wraps and unwraps, installed by the keyring (it reads the tables; this module reads none).

    ``before_wrap(master_key_id, known_ids)`` raises MasterKeyUnavailable to refuse a wrap with the current key
    (``known_ids``: the ids of every configured master key, so the guard needs nothing more from this module);
    ``unknown_key_met()`` runs when an unwrap meets a key id this process does not know.
    """

    before_wrap: Callable[[str, frozenset[str]], None]
    unknown_key_met: Callable[[], None]


_guard: WrapGuard | None = None


def wrap_guard_install(guard: WrapGuard) -> None:
    """Install the guard every verified wrap runs (MemoriesConfig.ready installs memories.keyring's)."""
    global _guard
    _guard = guard


class WrappedKey(NamedTuple):
    """A data key as every holder table stores it: sealed by a master key, and that master key's id.

    A tuple, so ``wrapped, key_id = wrap(...)`` reads naturally; ``open`` unwraps it with whichever
    configured master key has that id (memories.keyring lists every table holding these pairs).
    """

    wrapped: bytes  # nonce + AES-GCM(master key, data key, aad)
    wrapped_by: str  # the id of the master key that wrapped it (crypto.master_key_id)

    def open(self, *, aad: bytes) -> bytes:
        return unwrap(self.wrapped, wrapped_by=self.wrapped_by, aad=aad)



@sensitive_variables()
def _dev_master_key(path: Path) -> bytes:
    """Return the development master key, creating it (32 random bytes, mode 0600) on first use."""
    from core.keys import parse_master_key

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".master-key-")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, base64.urlsafe_b64encode(os.urandom(KEY_BYTES)) + b"\n")
            os.close(fd)
            try:
                # link() fails if another process won the race: everyone then reads the winner's key.
                os.link(tmp, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return parse_master_key(path.read_text().strip(), name="MNESIO_MASTER_KEY_DEV_FILE")


@sensitive_variables()
def master_key() -> bytes:
    """Return the current master key (MNESIO_MASTER_KEY, or the dev file when debugging)."""
    key = settings.MNESIO_MASTER_KEY
    if key:
        return key
    # settings.py already refused to start without a key unless MNESIO_DEBUG was on (settings.DEBUG itself
    # is not checked here: Django's test runner turns it off).
    return _dev_master_key(Path(settings.MNESIO_MASTER_KEY_DEV_FILE))


@sensitive_variables()
def master_key_id(key: bytes) -> str:
    """Return a short public fingerprint of a master key (what wrapped rows record)."""
    return hashlib.sha256(b"mnesio master key id\x00" + key).hexdigest()[:16]


@sensitive_variables()
def known_master_keys() -> dict[str, bytes]:
    """Return the configured master keys by id: the current one and MNESIO_MASTER_KEY_OLD if set."""
    keys = {}
    old = settings.MNESIO_MASTER_KEY_OLD
    if old:
        keys[master_key_id(old)] = old
    current = master_key()
    keys[master_key_id(current)] = current
    return keys


@sensitive_variables()
def new_data_key() -> bytes:
    """Return a fresh random AES-256 data key."""
    return AESGCM.generate_key(bit_length=256)


@sensitive_variables()
def seal(key: bytes, plaintext: bytes, *, aad: bytes) -> tuple[bytes, bytes]:
    """Encrypt ``plaintext`` with AES-256-GCM; return ``(nonce, ciphertext_with_tag)``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce, AESGCM(key).encrypt(nonce, plaintext, aad)


@sensitive_variables()
def seal_box(key: bytes, plaintext: bytes, *, aad: bytes) -> bytes:
    """Encrypt into one stored value, ``nonce + ciphertext_with_tag`` (what every sealed column and blob holds)."""
    nonce, ciphertext = seal(key, plaintext, aad=aad)
    return nonce + ciphertext


@sensitive_variables()
def open_box(key: bytes, box: bytes, *, aad: bytes) -> bytes:
    """Open a ``seal_box`` value; raises ``InvalidTag`` when anything (bytes, aad, key) does not match."""
    box = bytes(box)
    return unseal(key, box[:NONCE_BYTES], box[NONCE_BYTES:], aad=aad)


@sensitive_variables()
def unseal(key: bytes, nonce: bytes, ciphertext: bytes, *, aad: bytes) -> bytes:
    """Decrypt and authenticate; raises ``InvalidTag`` when anything (bytes, aad, key) does not match."""
    return AESGCM(key).decrypt(bytes(nonce), bytes(ciphertext), aad)


@sensitive_variables()
def wrap(data_key: bytes, *, aad: bytes, verify: bool = True) -> WrappedKey:
    """Wrap a data key with the current master key; return ``(nonce + ciphertext, wrapped_by)``.

    Each wrap first runs the installed guard (memories.keyring.master_key_wrap_check): the first wrap of a
    process verifies that the master key opens the keys already stored, so a process started with the wrong key
    refuses to write rather than wrap keys the right process could never open, and every wrap checks that no
    rotation retired the key. With no guard installed a wrap refuses. ``verify=False`` only for migrations, which
    run before every holder's table exists.
    """
    current = master_key()
    current_id = master_key_id(current)
    if verify:
        if _guard is None:
            raise MasterKeyUnavailable("no master-key check is installed, so nothing is wrapped; the memories app "
                                       "installs it when Django starts (memories.apps.MemoriesConfig.ready)")
        _guard.before_wrap(current_id, frozenset(known_master_keys()))
    return WrappedKey(seal_box(current, data_key, aad=aad), current_id)


@sensitive_variables()
def unwrap(wrapped: bytes, *, wrapped_by: str, aad: bytes) -> bytes:
    """Unwrap a data key with whichever configured master key has id ``wrapped_by``."""
    keys = known_master_keys()
    if wrapped_by not in keys:
        # a key rotated elsewhere since this process verified: verify again before its next wrap
        if _guard is not None:
            _guard.unknown_key_met()
        raise MasterKeyUnavailable(
            f"a data key was wrapped by master key id {wrapped_by!r}, but only {sorted(keys)} are configured; "
            "set `MNESIO_MASTER_KEY_OLD` to the previous key and run `manage.py rotate_master_key`"
        )
    return open_box(keys[wrapped_by], wrapped, aad=aad)


def memory_aad(*, seq: int, scope_id: int, subject_id: int | None) -> bytes:
    """Associated data of a memory: its log position, scope and subject (ids never change)."""
    return f"mnesio:memory:v1|seq={seq}|scope={scope_id}|subject={subject_id if subject_id is not None else '-'}".encode()


def subject_key_aad(external_id: str, scope_id: int | None = None) -> bytes:
    """Associated data of a wrapped subject key: its external id, and its scope (v2, per-scope subjects).

    Legacy subjects (no scope) keep the v1 form they were wrapped with; a key copied onto the same
    external id in another scope fails to open.
    """
    if scope_id is None:
        return b"mnesio:subject-key:v1|" + external_id.encode()
    return f"mnesio:subject-key:v2|scope={scope_id}|".encode() + external_id.encode()


def scope_key_aad(scope_id: int) -> bytes:
    """Associated data of a wrapped scope key."""
    return f"mnesio:scope-key:v1|{scope_id}".encode()


def memory_key_aad(*, seq: int, scope_id: int, subject_id: int | None) -> bytes:
    """Associated data of a memory's own wrapped key (MemoryKey): the memory it belongs to."""
    return b"mnesio:memory-key:v1|" + memory_aad(seq=seq, scope_id=scope_id, subject_id=subject_id)


def memory_metadata_aad(*, seq: int, scope_id: int, subject_id: int | None) -> bytes:
    """Associated data of a memory's sealed metadata (Memory.metadata_box)."""
    return b"mnesio:memory-metadata:v1|" + memory_aad(seq=seq, scope_id=scope_id, subject_id=subject_id)


def memory_resealed_aad(*, seq: int, scope_id: int, subject_id: int | None) -> bytes:
    """Associated data of a legacy memory's content re-sealed under its own key (MemoryKey.resealed)."""
    return b"mnesio:memory-resealed:v1|" + memory_aad(seq=seq, scope_id=scope_id, subject_id=subject_id)
