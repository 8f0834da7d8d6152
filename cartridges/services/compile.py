"""Compile a scope's log into a cartridge version, and rebuild (replay) any version from the log alone.

- The head defaults to the scope's head (its newest memory's seq) and is written into the header; an operator
  may name any head up to the global one. A version is unique per (scope, compatibility key, head, manifest
  digest), so a redelivered or concurrent compile returns the existing row, and an erasure at an unchanged head
  still gets a new version (its manifest lacks the erased seqs).
- Only the surviving texts in seq order and the head go into the backend (no scope name, no label), so two logs
  with the same surviving texts compile to the same bytes at the same head (docs/design/erasure.md).
- Over the context window: a 422 naming the model's limit and the token count, and what to do (split the scope,
  or a model with a longer window). No automatic split: it would silently break parity with re-reading.
- No blob without a row: the blob key row is committed first (an intent record), the blob written, then the
  version row; any failure deletes the blob and its key, and cartridge_blobs_sweep removes an intent row a
  killed process left. Call it outside an outer transaction: a rollback around it could not undo a file.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from core.errors import Conflict, MnesioError
from kvengine import ContextTooLongError, EmptyInputError
from kvengine.base import canonical_json
from kvengine.blocks import CartridgeParts
from kvengine.blocks import key_digest as engine_key_digest
from kvengine.format import BlockRef, read_tail_part
from memories.models import Subject
from memories.selectors import log_head as current_log_head
from memories.selectors import memory_keys_forgotten_lock, scope_head, scope_memories_open

from .. import conf, engine
from ..models import BlobKey, CartridgeBlock, CartridgeVersion, CartridgeVersionBlock, CartridgeVersionSubject
from ..selectors import ActiveConfiguration, active_configuration, active_version
from ..storage import blob_destroy, blob_reserve, blob_write, blobs_sweep, block_lookup, scope_blocks_live
from .blocksecret import scope_block_secret
from .errors import ContextTooLong, NothingToCompile

log = logging.getLogger("cartridges")


@dataclass(frozen=True)
class CompileInput:
    """What a compile depends on: the surviving texts in seq order, the head, and the manifest."""

    head: int
    texts: list[str]
    manifest: dict
    manifest_digest: str
    subjects: list[str]
    subject_ids: list[int]  # the subject rows behind the manifest: locked when the version is stored
    seqs: tuple[int, ...] = ()  # the surviving memories: their own keys are locked when the version is stored


class SubjectErasedDuringCompile(Exception):
    """A subject of the manifest was shredded while the compile ran: its version must not be stored."""


# How often a compile re-reads the log after losing a race with an erasure before it gives up.
MAX_COMPILE_ATTEMPTS = 3


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def head_validate(log_head: object, *, scope=None) -> int:
    """Return ``log_head`` as an int in [0, head], or raise naming `log_head`.

    The head is the global one for operators and services; with ``scope`` (a client's request) it is the
    scope's own head, for the default, the bound and the message, so no answer reveals the global head.
    """
    head = current_log_head() if scope is None else scope_head(scope=scope)
    if log_head is None:
        return head
    if isinstance(log_head, bool) or not isinstance(log_head, int):
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses; 19 digits spans a bigint.
        digits = log_head.strip() if isinstance(log_head, str) else ""
        if digits.isascii() and digits.isdigit() and len(digits) <= 19:
            log_head = int(log_head)
        else:
            raise MnesioError(f"`log_head` has to be an integer but got {str(log_head)[:40]!r}", extra={"field": "log_head"})
    if log_head < 0 or log_head > head:
        which = "the current log head" if scope is None else f"scope '{scope.name}''s head"
        raise MnesioError(
            f"`log_head` has to be between 0 and {which} {head} but got {log_head}",
            extra={"field": "log_head", "head": head},
        )
    return log_head


def compile_input(*, scope, head: int) -> CompileInput:
    """Open the scope's memories up to ``head`` and leave out the erased ones."""
    opened = scope_memories_open(scope=scope, as_of=head)
    surviving = [m for m in opened if not m.erased]
    manifest = {"entries": [[m.seq, m.subject] for m in surviving], "left_out": [m.seq for m in opened if m.erased]}
    if not surviving:
        raise NothingToCompile(
            f"`scope` '{scope.name}' has no memories to compile at log head {head}"
            + (f" ({len(opened)} erased)" if opened else "")
            + "; append memories first",
            extra={"field": "scope", "log_head": head, "num_erased": len(opened)},
        )
    return CompileInput(
        head=head,
        texts=[m.text for m in surviving],  # type: ignore[misc]
        manifest=manifest,
        manifest_digest=_sha256(canonical_json(manifest)),
        subjects=sorted({m.subject for m in surviving if m.subject}),
        subject_ids=sorted({m.subject_id for m in surviving if m.subject_id is not None}),
        seqs=tuple(m.seq for m in surviving),
    )


def key_digest(compat_key: dict[str, str]) -> str:
    """The digest of a compatibility key, the file format version and q4's calibrated plan (kvengine.blocks.key_digest):
    a version compiled under another plan is not the one a compile after a recalibration finds (_existing), nor one
    whose gate an incremental gate builds on."""
    return engine_key_digest(compat_key)


def compile_parts(*, backend, data: CompileInput, scope, reuse: bool = True) -> tuple[Any, CartridgeParts]:
    """Compile under the scope's block-id secret (reusing its stored blocks unless ``reuse`` is False) and serialize
    by parts; the blocks the scope stores already are not serialized again (their bytes are None: _version_store
    links their rows)."""
    secret = scope_block_secret(scope=scope)
    if not reuse:
        cartridge = compile_cartridge(backend=backend, data=data, block_secret=secret)
        return cartridge, backend.dump_parts(cartridge)
    live = scope_blocks_live(scope=scope)
    cartridge = compile_cartridge(backend=backend, data=data, blocks=block_lookup(scope=scope, live=live), block_secret=secret)
    stored = {BlockRef(row.block_id, row.first_position, row.num_tokens, row.part_sha256) for row, _ in live.values()}
    return cartridge, backend.dump_parts(cartridge, stored=stored)


def compile_cartridge(*, backend, data: CompileInput, block_secret: bytes, blocks=None):
    """Run the backend over the texts (reusing ``blocks``, a kvengine BlockLookup; block ids keyed by
    ``block_secret``, services/blocksecret.py) and return the Cartridge. The secret has no default here: the
    engine's default (b"") would store public ids, a guess oracle (tests/cartridges/test_block_ids_on_transformers.py)."""
    limit = backend.describe().max_context_tokens
    num_tokens = backend.count_tokens(data.texts)
    if num_tokens > limit:
        raise ContextTooLong(
            f"the memories take {num_tokens} tokens but the model's context window allows {limit}; "
            "split the scope into several scopes (by topic or time) or switch to a model with a longer window",
            extra={"field": "scope", "num_tokens": num_tokens, "limit": limit},
        )
    try:
        return backend.compile(data.texts, log_head=data.head, blocks=blocks, block_secret=block_secret)
    except ContextTooLongError as exc:
        raise ContextTooLong(str(exc), extra={"field": "scope", "num_tokens": exc.num_tokens, "limit": exc.limit}) from None
    except EmptyInputError as exc:
        raise NothingToCompile(str(exc), extra={"field": "scope"}) from None


def _existing(*, scope, digest: str, head: int, manifest_digest: str) -> CartridgeVersion | None:
    return CartridgeVersion.objects.filter(
        scope=scope, key_digest=digest, log_head=head, manifest_digest=manifest_digest
    ).first()


def cartridge_compile(*, scope, log_head: int | None = None, actor=None) -> CartridgeVersion:
    """Compile ``scope`` at ``log_head`` (default: the scope's head) under the active configuration; idempotent.

    A subject erased while the model runs makes the store refuse the version (the erasure's shred and
    the store lock the same subject rows, see _version_store); the compile then reads the log again,
    without the erased memories, up to MAX_COMPILE_ATTEMPTS times.
    """
    head = scope_head(scope=scope) if log_head is None else head_validate(log_head)
    config: ActiveConfiguration = active_configuration()
    for attempt in range(1, MAX_COMPILE_ATTEMPTS + 1):
        data = compile_input(scope=scope, head=head)
        backend = engine.backend_for(config)
        digest = key_digest(backend.describe().compat_key())
        found = _existing(scope=scope, digest=digest, head=head, manifest_digest=data.manifest_digest)
        if found is not None:
            return found
        if attempt == 1:
            blobs_sweep(older_than_s=conf.orphan_blob_grace_s())
            pause = conf.compile_pause_s()
            if pause:
                time.sleep(pause)  # fault injection (tests kill the worker or erase here); 0 in production
        started = time.perf_counter()
        cartridge, parts = compile_parts(backend=backend, data=data, scope=scope)
        compile_s = time.perf_counter() - started
        header, _, _ = read_tail_part(parts.tail)  # verifies the tail's structure and digest before anything is stored
        supersedes = active_version(scope=scope, configuration=config)
        try:
            version = _version_store(
                scope=scope, config=config, header=header, parts=parts, data=data, digest=digest,
                supersedes=supersedes, actor=actor, positions=list(cartridge.stats.get("memory_positions") or []),
            )
        except SubjectErasedDuringCompile:
            log.info("compile scope=%s attempt=%s lost a race with an erasure; reading the log again", scope.pk, attempt)
            continue
        if version.sha256 == parts.digest:  # ours, not a concurrent compile's row: its gate and first answers need no load
            engine.cartridge_cache_put(version=version, config=config, cartridge=cartridge)
        log.info(
            "cartridge compiled version=%s scope=%s head=%s num_memories=%s num_tokens=%s blocks_reused=%s blocks_computed=%s compile_s=%.3f",
            version.pk, scope.pk, head, len(data.texts), header.num_tokens, cartridge.stats.get("blocks_reused"),
            cartridge.stats.get("blocks_computed"), compile_s,
        )
        return version
    raise Conflict(
        f"`scope` '{scope.name}' had subjects erased during each of {MAX_COMPILE_ATTEMPTS} compiles; nothing was "
        "stored, ask for the compile again",
        extra={"field": "scope", "kind": "erased_during_compile"},
    )


def manifest_subjects_lock(subject_ids: list[int]) -> None:
    """Lock the manifest's subject rows until the caller's transaction ends; raise if any is shredded.

    An erasure shreds with an UPDATE of the same rows, so the two are ordered: a shred that committed
    first is seen here (the version is refused), and one that comes later waits for this transaction,
    after which the erasure's rebuild finds the stored version and destroys it. On SQLite the write
    lock every transaction takes at BEGIN (transaction_mode IMMEDIATE) gives the same order.
    """
    assert transaction.get_connection().in_atomic_block
    rows = Subject.objects.select_for_update().filter(pk__in=subject_ids).order_by("pk").values_list("pk", "shredded_at")
    if any(shredded_at is not None for _, shredded_at in rows):
        raise SubjectErasedDuringCompile


def manifest_memory_keys_lock(seqs: tuple[int, ...]) -> None:
    """The same order for one forgotten memory or a deleted scope: lock the manifest's own keys; raise if any is
    shredded (memories.selectors.memory_keys_forgotten_lock)."""
    assert transaction.get_connection().in_atomic_block
    if seqs and memory_keys_forgotten_lock(seqs=seqs):
        raise SubjectErasedDuringCompile


class BlockGoneDuringCompile(SubjectErasedDuringCompile):
    """A block the compile reused was destroyed (erasure or prune) before the version was stored: compile again."""


def _version_store(
    *, scope, config, header, parts: CartridgeParts, data: CompileInput, digest: str, supersedes, actor, positions: list[int]
) -> CartridgeVersion:
    """Write the tail blob, every block the scope does not store yet, and the version's rows: all or none.

    Blobs are written before the transaction (their key rows are committed first as intents: a kill -9 in
    between leaves key rows that cartridge_blobs_sweep removes); the version row, the new block rows and the
    version's block links commit together, after locking the key rows of the reused blocks (a block destroyed
    meanwhile makes the compile run again) and the manifest's subjects and memory keys (an erasure meanwhile
    makes it read the log again).
    """
    written: list[str] = []
    try:
        tail_row, key = blob_reserve(scope=scope)
        written.append(tail_row.storage_name)
        stored = blob_write(blob=tail_row, key=key, data=parts.tail)
        live = scope_blocks_live(scope=scope)
        links: list[CartridgeBlock] = []  # per block index: a reused row (saved) or a new one (unsaved)
        size_bytes = len(parts.tail)
        for ref, block_data in parts.blocks:
            found = live.get(ref.block_id)
            if found is not None and found[0].part_sha256 == ref.sha256:
                links.append(found[0])
                size_bytes += found[0].size_bytes
                continue
            if block_data is None:  # stored when the compile began, destroyed (erasure, prune) since
                raise BlockGoneDuringCompile
            size_bytes += len(block_data)
            row, block_key = blob_reserve(scope=scope, suffix="kvb")
            written.append(row.storage_name)
            block_stored = blob_write(blob=row, key=block_key, data=block_data)
            links.append(CartridgeBlock(
                scope=scope, block_id=ref.block_id, first_position=ref.first_position, num_tokens=ref.num_tokens,
                part_sha256=ref.sha256, sha256=_sha256(block_data), size_bytes=len(block_data),
                stored_sha256=block_stored.stored_sha256, stored_size_bytes=block_stored.stored_size_bytes,
                storage_name=block_stored.name,
            ))
        pause = conf.store_pause_s()
        if pause:
            time.sleep(pause)  # fault injection (tests kill the worker here: blobs written, no version yet); 0 in production
        with transaction.atomic():
            manifest_subjects_lock(data.subject_ids)
            manifest_memory_keys_lock(data.seqs)
            reused = sorted({row.storage_name for row in links if row.pk is not None})
            # in storage_name order, as the prune locks them (services/retention.py): an order left to the plan can deadlock
            alive = set(
                BlobKey.objects.select_for_update().filter(storage_name__in=reused).order_by("storage_name")
                .values_list("storage_name", flat=True)
            )
            if len(alive) != len(reused):
                raise BlockGoneDuringCompile
            version = CartridgeVersion.objects.create(
                scope=scope,
                configuration=config.row,
                **CartridgeVersion.config_columns(config.config),
                format_version=header.format_version,
                **header.compat_key(),
                key_digest=digest,
                log_head=header.log_head,
                num_tokens=header.num_tokens,
                num_memories=len(data.texts),
                sha256=parts.digest,
                payload_sha256=header.payload_sha256,
                size_bytes=size_bytes,
                stored_sha256=stored.stored_sha256,
                stored_size_bytes=stored.stored_size_bytes,
                storage_name=stored.name,
                manifest=data.manifest,
                manifest_digest=data.manifest_digest,
                supersedes=supersedes,
                created_by=actor,
                block_size=header.block_size,
                entry_positions=positions if len(positions) == len(data.texts) else [],
            )
            for row in links:
                if row.pk is None:
                    row.save()
            CartridgeVersionBlock.objects.bulk_create(
                [CartridgeVersionBlock(version=version, index=index, block=row) for index, row in enumerate(links)]
            )
            CartridgeVersionSubject.objects.bulk_create(
                [CartridgeVersionSubject(version=version, subject=s) for s in data.subjects]
            )
    except IntegrityError:
        # a concurrent compile of the same content won the unique constraint: keep its row, drop our blobs
        for name in written:
            blob_destroy(storage_name=name)
        found = _existing(scope=scope, digest=digest, head=data.head, manifest_digest=data.manifest_digest)
        if found is None:
            raise
        return found
    except BaseException:
        for name in written:
            blob_destroy(storage_name=name)
        raise
    return version


@dataclass(frozen=True)
class RebuildResult:
    """The outcome of recompiling a version from the log alone."""

    version_id: int
    expected_sha256: str
    rebuilt_sha256: str
    size_bytes: int

    @property
    def matches(self) -> bool:
        return self.expected_sha256 == self.rebuilt_sha256


def cartridge_rebuild(*, version: CartridgeVersion) -> RebuildResult:
    """Recompile ``version`` from the log (same scope, head and configuration) and compare the sha256.

    Writes nothing. Refuses (409) when the log no longer yields the version's memories (a subject was
    erased since: such a version must not be rebuilt) or when this process cannot build its key.
    """
    try:
        data: CompileInput | None = compile_input(scope=version.scope, head=version.log_head)
    except NothingToCompile:
        data = None
    if data is None or data.manifest_digest != version.manifest_digest:
        raise Conflict(
            f"the log at head {version.log_head} no longer yields the memories of version {version.pk} "
            "(a subject was erased since); it cannot be rebuilt",
            extra={"version": version.pk},
        )
    backend = engine.backend_for(version.config)
    digest = key_digest(backend.describe().compat_key())
    if digest != version.key_digest:
        raise Conflict(
            f"this process's {version.config.key} backend has another compatibility key than version "
            f"{version.pk} (other weights, tokenizer or template); it cannot reproduce it",
            extra={"version": version.pk},
        )
    if version.block_size and getattr(backend, "block_size", version.block_size) != version.block_size:
        backend = backend.variant(block_size=version.block_size)  # the same weights, cut as the version was
    _, parts = compile_parts(backend=backend, data=data, scope=version.scope, reuse=False)  # from scratch: no stored block is reused
    return RebuildResult(version_id=version.pk, expected_sha256=version.sha256, rebuilt_sha256=parts.digest, size_bytes=parts.size_bytes)
