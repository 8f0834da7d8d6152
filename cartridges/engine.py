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

from kvengine import Cartridge, KvBackend, make_backend

from . import conf
from .models import CartridgeVersion
from .storage import blob_read

log = logging.getLogger("cartridges")

ConfigTuple = tuple[str, str, str, str]  # (backend, model, dtype, quant)

_lock = threading.RLock()
_backends: dict[ConfigTuple, KvBackend] = {}
_cartridges: OrderedDict[tuple[int, ConfigTuple], Cartridge] = OrderedDict()
_stats = {"hits": 0, "misses": 0, "evictions": 0, "backend_loads": 0}


def backend_for(config: Any) -> KvBackend:
    """Return this process's backend for ``config`` (an ActiveConfiguration or a config tuple), loading it once."""
    key: ConfigTuple = tuple(config) if isinstance(config, tuple) else config.as_tuple()  # type: ignore[assignment]
    with _lock:
        backend = _backends.get(key)
        if backend is None:
            name, model, dtype, quant = key
            sibling = next(
                (b for k, b in _backends.items() if k[:2] == (name, model) and (k[2] == dtype or k[2] == "f32")), None
            )
            if sibling is not None and hasattr(sibling, "variant"):
                # a quant (or f32 -> lower dtype) switch reuses the loaded weights instead of loading the model again
                backend = sibling.variant(dtype=dtype, quant=quant)
                _backends[key] = backend
                return backend
            options: dict[str, Any] = {"model": model, "dtype": dtype, "quant": quant}
            options["device"] = str(getattr(settings, "MNESIO_KV_DEVICE", "auto"))
            if name == "transformers":
                options["cache_dir"] = str(getattr(settings, "MNESIO_MODEL_CACHE_DIR", ""))
            log.info("loading kv backend %s", ":".join(key))
            backend = make_backend(name, **options)
            _backends[key] = backend
            _stats["backend_loads"] += 1
        return backend


def register_backend(config: ConfigTuple, backend: KvBackend) -> None:
    """Use an already loaded ``backend`` for ``config`` in this process (tests share one real model)."""
    with _lock:
        _backends[tuple(config)] = backend  # type: ignore[index]


def cartridge_load(*, version: CartridgeVersion, config: Any) -> tuple[Cartridge, KvBackend]:
    """Return the loaded cartridge of ``version`` and the backend serving it (LRU-cached).

    A miss reads the blob (stored digest, GCM tag and file sha256 checked by storage.blob_read) and has
    the backend verify the payload sha256 and compatibility key (kvengine loads), so a tampered or
    foreign blob is refused at load.
    """
    backend = backend_for(config)
    key = (version.pk, tuple(config) if isinstance(config, tuple) else config.as_tuple())
    with _lock:
        cartridge = _cartridges.get(key)
        if cartridge is not None:
            _cartridges.move_to_end(key)
            _stats["hits"] += 1
            return cartridge, backend
        _stats["misses"] += 1
        cartridge = backend.loads(blob_read(version=version))
        size = conf.cartridge_cache_size()
        if size > 0:
            _cartridges[key] = cartridge
            while len(_cartridges) > size:
                _cartridges.popitem(last=False)
                _stats["evictions"] += 1
        return cartridge, backend


def cartridge_forget(*, version_id: int) -> None:
    """Drop a version from this process's LRU (after destruction)."""
    with _lock:
        for key in [k for k in _cartridges if k[0] == version_id]:
            del _cartridges[key]


def cache_clear(*, backends: bool = False) -> None:
    """Empty the cartridge LRU (and the backends when asked)."""
    with _lock:
        _cartridges.clear()
        if backends:
            _backends.clear()


def cache_info() -> dict[str, Any]:
    """Sizes and counters of this process's caches (for metrics)."""
    with _lock:
        return {
            "cartridges_loaded": len(_cartridges),
            "cartridge_cache_size": conf.cartridge_cache_size(),
            "backends_loaded": [":".join(k) for k in _backends],
            **_stats,
        }
