"""The routed layout's chunks (RoutedChunk): compiled once per (memory, configuration), sealed, opened, destroyed.

A chunk is one memory's KV computed on its own after the shared prefix (kvengine.routed). Its bytes are sealed
under the memory's own data key (memories.selectors.memory_own_keys) with associated data naming the memory and
the configuration, so a row copied onto another memory, scope or configuration fails to open, and shredding the
memory's key, its subject's key or its scope's keys leaves them unreadable. Every erasure kind also deletes the
erased memories' rows (``routed_chunks_destroy``, called by services/erase.py); no other chunk is touched: a
chunk depends on its own memory's text only, so nothing is recomputed.

Opened chunks are kept in this process's LRU (cartridges/chunk_cache.py); rows are read on every ask, so a
destroyed chunk is never served from it.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable
from typing import Any

from django.db import IntegrityError, transaction
from django.views.decorators.debug import sensitive_variables

from core.errors import MnesioError
from kvengine.errors import ConfigError
from memories import crypto
from memories.models import ErasureKind, ErasureRequest, Scope
from memories.selectors import erasure_request_memories, memories_open, memory_own_keys, scope_memories

from .. import conf, engine
from ..chunk_cache import chunk_cache_get, chunk_cache_put, routed_chunks_forget
from ..models import RoutedChunk
from .blocksecret import scope_block_secret
from .compile import SubjectErasedDuringCompile, manifest_memory_keys_lock, manifest_subjects_lock

log = logging.getLogger("cartridges")


def repair_policy(name: str):
    """The kvengine RepairPolicy named ``name``: none, full, first-N or deviation-P% (RepairPolicy.name's forms)."""
    from kvengine.routed import RepairPolicy  # torch: only where a routed answer is made

    text = str(name).strip()
    try:
        if text in ("none", "full"):
            return RepairPolicy(text)
        if text.startswith("first-"):
            return RepairPolicy.first(int(text.removeprefix("first-")))
        if text.startswith("deviation-") and text.endswith("%"):
            return RepairPolicy.deviation(float(text.removeprefix("deviation-").removesuffix("%")) / 100)
    except (ValueError, ConfigError):  # a bad number: int()/float(), or out of the engine's range
        pass
    raise MnesioError(
        f"`repair` has to be one of ['none', 'full', 'first-N', 'deviation-P%'] but got {name!r}", extra={"field": "repair"}
    )


def chunk_aad(*, seq: int, scope_id: int, config_key: str) -> bytes:
    """Associated data of a sealed chunk: the memory, its scope and the configuration it was compiled under."""
    return f"mnesio:routed-chunk:v1|seq={seq}|scope={scope_id}|config={config_key}".encode()


def chunk_id_of(*, secret: bytes, config_key: str, token_ids: Iterable[int]) -> str:
    """A chunk's id: HMAC-SHA256 of its token ids under the scope's block secret (no guess oracle without it)."""
    message = f"mnesio:routed-chunk-id:v1|{config_key}|".encode() + ",".join(str(int(i)) for i in token_ids).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


@sensitive_variables()
def routed_chunks_compile(*, scope: Scope, config: Any, seqs: Iterable[int] | None = None) -> int:
    """Compile and store the chunks of ``scope``'s memories (those in ``seqs``, or all) that have none under
    ``config``; erased memories and memories without their own key are skipped. Returns how many were made.
    Safe to run twice and concurrently (a unique row per memory and configuration)."""
    config_key = engine.kv_config(config).key
    rows = scope_memories(scope=scope)
    if seqs is not None:
        rows = rows.filter(seq__in=list(seqs))
    done = set(RoutedChunk.objects.filter(scope=scope, config_key=config_key).values_list("memory__seq", flat=True))
    missing = [row for row in rows if row.seq not in done]
    if not missing:
        return 0
    keys = memory_own_keys(missing)
    texts = {m.seq: m.text for m in memories_open([row for row in missing if row.seq in keys]) if not m.erased}
    if not any(text.strip() for text in texts.values()):
        return 0  # nothing to compile: no block secret is made (a deleted scope's was shredded)
    backend = engine.backend_for(config)
    secret = scope_block_secret(scope=scope)
    quant = conf.routed_chunk_quant()
    made = 0
    for row in missing:
        if row.seq not in texts or not texts[row.seq].strip():
            continue
        chunk = backend.compile_chunk(texts[row.seq])
        data = backend.chunk_dumps(chunk, quant=quant)
        sealed = crypto.seal_box(keys[row.seq], data, aad=chunk_aad(seq=row.seq, scope_id=scope.pk, config_key=config_key))
        try:
            with transaction.atomic():
                # The keys were read before the model ran: an erasure since then has shredded them and found no
                # row to destroy. Lock the memory's subject and own key (in the order a cartridge compile does)
                # and store nothing if either is shredded; a shred that comes later waits for this commit, and its
                # rebuild then destroys the row (routed_chunks_destroy).
                manifest_subjects_lock([row.subject_id] if row.subject_id is not None else [])
                manifest_memory_keys_lock((row.seq,))
                RoutedChunk.objects.create(
                    scope=scope, memory=row, config_key=config_key, quant=quant, num_tokens=chunk.num_tokens, sealed=sealed,
                    chunk_id=chunk_id_of(secret=secret, config_key=config_key, token_ids=chunk.token_ids),
                )
            made += 1
        except IntegrityError:  # another process compiled it first: the same chunk
            continue
        except SubjectErasedDuringCompile:  # erased while its chunk compiled: nothing of it is stored
            log.info("routed chunk of seq=%s not stored: erased during its compile", row.seq)
            continue
    log.info("routed chunks compiled scope=%s config=%s made=%d", scope.pk, config_key, made)
    return made


@sensitive_variables()
def routed_chunks_open(*, scope: Scope, config: Any, seqs: Iterable[int]) -> dict[int, Any]:
    """The opened chunks of ``scope``'s memories ``seqs`` under ``config``, by seq; a memory with no live chunk
    (erased, or not compiled) is absent. Rows are read on every call: a destroyed chunk is never served from the LRU.
    """
    config_key = engine.kv_config(config).key
    wanted = sorted(set(seqs))
    rows = list(
        RoutedChunk.objects.filter(scope=scope, config_key=config_key, memory__seq__in=wanted)
        .select_related("memory", "memory__scope__key", "memory__subject", "memory__own_key")
    )
    held = chunk_cache_get(row.pk for row in rows)
    opened: dict[int, Any] = {row.memory.seq: held[row.pk] for row in rows if row.pk in held}
    misses = [row for row in rows if row.memory.seq not in opened]
    if misses:
        keys = memory_own_keys([row.memory for row in misses])
        backend = engine.backend_for(config)
        for row in misses:
            key = keys.get(row.memory.seq)
            if key is None:  # its memory was erased and its row not yet deleted: unreadable, not served
                continue
            data = crypto.open_box(key, row.sealed, aad=chunk_aad(seq=row.memory.seq, scope_id=scope.pk, config_key=config_key))
            opened[row.memory.seq] = chunk = backend.chunk_loads(data)
            chunk_cache_put(row.pk, chunk)
    return opened


def routed_chunks_destroy(*, erasure_request: ErasureRequest) -> int:
    """Delete the chunks of the memories ``erasure_request`` erased (every chunk of a deleted scope); nothing else
    changes. Safe to run twice. Returns how many rows were deleted."""
    if erasure_request.kind == ErasureKind.SCOPE:
        rows = RoutedChunk.objects.filter(scope_id=erasure_request.scope_id)
    else:
        rows = RoutedChunk.objects.filter(memory__in=erasure_request_memories(erasure_request=erasure_request))
    pks = list(rows.values_list("pk", flat=True))
    deleted, _ = RoutedChunk.objects.filter(pk__in=pks).delete()
    routed_chunks_forget(pks=pks)
    log.info("routed chunks destroyed erasure_request=%s chunks=%d", erasure_request.pk, deleted)
    return deleted

