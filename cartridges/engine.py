"""The per-process engine: one backend per configuration (the model is loaded once per process) and a
bounded LRU of loaded cartridges.

Thread safety: the registry and the LRU are guarded by one lock; loading a model or a cartridge happens
under it, so two threads never load the same model twice. Serving from a loaded cartridge is the
backend's business (kvengine documents what is safe to share). The LRU is only a cache: whether a version
may serve is decided from the database on every answer (cartridges.selectors.active_version), so a version
destroyed by another process is never answered from here even if it is still in this process's memory.
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from core.errors import MnesioError
from kvengine import Cartridge, CorruptCartridgeError, IncompatibleCartridgeError, KvBackend, KvConfig, make_backend

from . import conf
from .chunk_cache import routed_chunks_cache_clear, routed_chunks_purge_destroyed
from .models import BlobKey, CartridgeEvaluation, CartridgeVersion
from .storage import BlobTampered, BlobUnavailable, block_cache_drop, block_cache_names, version_parts_read

log = logging.getLogger("cartridges")

_lock = threading.RLock()
_backends: dict[KvConfig, KvBackend] = {}
_cartridges: OrderedDict[tuple[int, KvConfig], Cartridge] = OrderedDict()
_names: dict[int, str] = {}  # storage name of each cached version's own blob (cartridges_purge_destroyed checks it)
_stats = {"hits": 0, "misses": 0, "evictions": 0, "backend_loads": 0}


def kv_config(config: Any) -> KvConfig:
    """The KvConfig of ``config``: a KvConfig, an ActiveConfiguration (``.config``) or a (backend, model, dtype, quant)."""
    if isinstance(config, KvConfig):
        return config
    if isinstance(getattr(config, "config", None), KvConfig):
        return config.config
    return KvConfig(*config)


def backend_for(config: Any) -> KvBackend:
    """Return this process's backend for ``config`` (see kv_config), loading the model once per process."""
    config = kv_config(config)
    with _lock:
        backend = _backends.get(config)
        if backend is not None:
            return backend
        # a quant (or f32 -> lower dtype) switch reuses loaded weights when the backend can (KvBackend.variant)
        for loaded_config, loaded in list(_backends.items()):
            same_model = (loaded_config.backend, loaded_config.model) == (config.backend, config.model)
            if same_model and loaded_config.dtype in (config.dtype, "f32"):
                backend = loaded.variant(dtype=config.dtype, quant=config.quant)
                if backend is not None:
                    _backends[config] = backend
                    return backend
        options: dict[str, Any] = {"model": config.model, "dtype": config.dtype, "quant": config.quant}
        options["device"] = str(settings.MNESIO_KV_DEVICE)
        if config.backend == "transformers":
            options["cache_dir"] = str(settings.MNESIO_MODEL_CACHE_DIR)
            options["block_size"] = int(settings.MNESIO_KV_BLOCK_SIZE)
            options["compile_step"] = bool(settings.MNESIO_KV_COMPILE_STEP)
        log.info("loading kv backend %s", config.key)
        backend = make_backend(config.backend, **options)
        _backends[config] = backend
        _stats["backend_loads"] += 1
        return backend


def register_backend(config: Any, backend: KvBackend) -> None:
    """Use an already loaded ``backend`` for ``config`` in this process (tests share one real model)."""
    with _lock:
        _backends[kv_config(config)] = backend


def cartridge_load(*, version: CartridgeVersion, config: Any, record_refusal: bool = True) -> tuple[Cartridge, KvBackend]:
    """Return the loaded cartridge of ``version`` and the backend serving it (LRU-cached).

    A miss reads the version's parts (stored digest, GCM tag and sha256 of each checked by storage.version_parts_read) and has
    the backend verify the payload sha256 and compatibility key (kvengine loads), so a tampered or
    foreign blob is refused at load, with a warning and a failed evaluation row (stage "load").
    """
    backend = backend_for(config)
    key = (version.pk, kv_config(config))
    with _lock:
        cartridge = _cartridges.get(key)
        if cartridge is not None:
            _cartridges.move_to_end(key)
            _stats["hits"] += 1
            return cartridge, backend
        _stats["misses"] += 1
        try:
            tail, blocks = version_parts_read(version=version)
            if not version.block_size and not blocks:
                cartridge = backend.loads(tail)  # a version stored whole: one file, no block parts
            else:
                cartridge = backend.load_parts(tail, blocks.get)
        except (BlobUnavailable, BlobTampered, CorruptCartridgeError, IncompatibleCartridgeError) as exc:
            if record_refusal:  # the gate records its own evaluation instead
                _load_refusal_record(version=version, config_key=key[1].key, exc=exc)
            raise
        size = conf.cartridge_cache_size()
        if size > 0:
            _cartridges[key] = cartridge
            _names[version.pk] = version.storage_name
            _evict(size)
        return cartridge, backend


def cartridge_cache_put(*, version: CartridgeVersion, config: Any, cartridge: Cartridge) -> None:
    """Keep a cartridge this process just compiled and stored as ``version`` in the LRU (no reload for its gate).

    Only for the cartridge whose parts were stored as that version (compile() is deterministic: it is what a load
    would give); whether it may serve is still decided per answer from the database.
    """
    size = conf.cartridge_cache_size()
    if size <= 0:
        return
    with _lock:
        _cartridges[(version.pk, kv_config(config))] = cartridge
        _names[version.pk] = version.storage_name
        _evict(size)


def _evict(size: int) -> None:
    """Drop the least recently used cartridges beyond ``size`` (the caller holds the lock)."""
    while len(_cartridges) > size:
        (version_id, _), _ = _cartridges.popitem(last=False)
        _stats["evictions"] += 1
        if not any(key[0] == version_id for key in _cartridges):
            _names.pop(version_id, None)


def _load_refusal_record(*, version: CartridgeVersion, config_key: str, exc: Exception) -> None:
    """Log a refused load and record it as a failed evaluation (stage "load"); never masks ``exc``.

    The row is what makes a damaged blob visible to operators (admin history, version_state) and makes
    the next activation of the version re-run the gate. A version refused again for the same reason
    does not add a row per request: the newest evaluation already says so.
    """
    if isinstance(exc, MnesioError):
        reason, check = exc.message, str(exc.extra.get("check") or type(exc).__name__)
    else:  # the engine's checks (payload sha256, compatibility key); messages hold no memory text
        reason, check = f"the backend refuses to load version {version.pk}: {exc}", type(exc).__name__
    log.warning("cartridge load refused version=%s scope=%s check=%s: %s", version.pk, version.scope_id, check, reason)
    try:
        with transaction.atomic():
            newest = CartridgeEvaluation.objects.filter(version=version).order_by("-created_at", "-id").first()
            if newest is not None and not newest.passed and newest.figures.get("stage") == "load" and newest.reasons == [reason]:
                return
            CartridgeEvaluation.objects.create(
                version=version,
                passed=False,
                reasons=[reason],
                figures={"stage": "load", "check": check},
                config_key=config_key,
            )
    except DatabaseError:  # the refusal itself still reaches the caller; the log line above is the record
        log.exception("could not record the refused load of cartridge version=%s", version.pk)


def cartridges_purge_destroyed() -> list[int]:
    """Drop every cached cartridge, decrypted block part and opened routed chunk that was destroyed, and the search
    embeddings of scopes erased from (memories.search_dense); return the versions' ids.

    Runs at the start of every request and every task of this process (CartridgesConfig.ready connects
    it), so a version, block or routed chunk destroyed by another process (an erasure processed by a worker, a
    prune) leaves this process's memory within one request. A blob is destroyed when its key row (BlobKey)
    is gone, which destruction and pruning do first: one query over the cached names while either cache holds
    anything, none when both are empty; a routed chunk when its row is gone: one more query while the chunk LRU
    holds anything (chunk_cache.py). (Whether a cached version may still serve is decided per answer
    by active_version, manifest included.)
    """
    from memories.search_dense import dense_purge_stale

    chunks = routed_chunks_purge_destroyed()
    if chunks:
        log.info("dropped %d destroyed routed chunk(s) from this process's chunk cache", chunks)
    embedded = dense_purge_stale()
    if embedded:
        log.info("dropped the search embeddings of %d erased-from scope(s) from this process", embedded)
    with _lock:
        versions = {key[0]: _names[key[0]] for key in _cartridges if key[0] in _names}
    blocks = block_cache_names()
    if not versions and not blocks:
        return []
    live = set(BlobKey.objects.filter(storage_name__in=[*versions.values(), *blocks]).values_list("storage_name", flat=True))
    destroyed = sorted(version_id for version_id, name in versions.items() if name not in live)
    for version_id in destroyed:
        cartridge_forget(version_id=version_id)
    gone = [name for name in blocks if name not in live]
    block_cache_drop(gone)
    if destroyed or gone:
        log.info("dropped %d destroyed cartridge(s) %s and %d destroyed block(s) from this process's caches",
                 len(destroyed), destroyed, len(gone))
    return destroyed


def cartridge_forget(*, version_id: int) -> None:
    """Drop a version from this process's LRU (after destruction)."""
    with _lock:
        for key in [k for k in _cartridges if k[0] == version_id]:
            del _cartridges[key]
        _names.pop(version_id, None)


def cache_clear(*, backends: bool = False) -> None:
    """Empty the cartridge LRU and the routed chunk LRU (and the backends when asked)."""
    routed_chunks_cache_clear()
    with _lock:
        _cartridges.clear()
        _names.clear()
        if backends:
            _backends.clear()


def cache_info() -> dict[str, Any]:
    """Sizes and counters of this process's caches (for metrics)."""
    with _lock:
        return {
            "cartridges_loaded": len(_cartridges),
            "cartridge_cache_size": conf.cartridge_cache_size(),
            "backends_loaded": [config.key for config in _backends],
            **_stats,
        }
