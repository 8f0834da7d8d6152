"""This process's bounded LRU of opened routed chunks, keyed by RoutedChunk row id.

Only a cache: whether a chunk may serve is decided from the database on every ask (services/routed_chunks.py
reads the rows first), so a chunk destroyed by another process is never used from here. The erasing process
drops the rows it deletes (routed_chunks_destroy); every other process drops them at the start of its next
request or task (routed_chunks_purge_destroyed, run by engine.cartridges_purge_destroyed: one query over the
LRU's row ids while it holds anything), so no decrypted chunk outlives its row by more than one request.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from . import conf
from .models import RoutedChunk

_lock = threading.Lock()
_opened: OrderedDict[int, Any] = OrderedDict()  # RoutedChunk.pk -> the backend's opened chunk
_stats = {"hits": 0, "misses": 0, "evictions": 0, "dropped": 0}


def chunk_cache_get(pks: Iterable[int]) -> dict[int, Any]:
    """The held chunks among the row ids ``pks``, by row id (each counted as a hit and made most recent)."""
    found: dict[int, Any] = {}
    with _lock:
        for pk in pks:
            if pk in _opened:
                _opened.move_to_end(pk)
                found[pk] = _opened[pk]
                _stats["hits"] += 1
    return found


def chunk_cache_put(pk: int, chunk: Any) -> None:
    """Hold the chunk opened from row ``pk`` (a miss), evicting the least recent past the configured size."""
    size = conf.routed_chunk_cache_size()
    if size <= 0:
        return
    with _lock:
        _stats["misses"] += 1
        _opened[pk] = chunk
        while len(_opened) > size:
            _opened.popitem(last=False)
            _stats["evictions"] += 1


def chunk_cache_held() -> list[int]:
    """The row ids this process holds, oldest first."""
    with _lock:
        return list(_opened)


def routed_chunks_forget(*, pks: Iterable[int]) -> int:
    """Drop the chunks with row ids ``pks`` from this process's LRU; how many were held."""
    with _lock:
        dropped = sum(_opened.pop(pk, None) is not None for pk in pks)
        _stats["dropped"] += dropped
    return dropped


def routed_chunks_purge_destroyed() -> int:
    """Drop the opened chunks whose row is gone (destroyed by another process); how many were dropped.

    One query over the LRU's row ids while it holds anything, none when it is empty.
    """
    held = chunk_cache_held()
    if not held:
        return 0
    live = set(RoutedChunk.objects.filter(pk__in=held).values_list("pk", flat=True))
    return routed_chunks_forget(pks=[pk for pk in held if pk not in live])


def routed_chunks_cache_clear() -> None:
    """Empty this process's chunk LRU."""
    with _lock:
        _opened.clear()


def routed_chunk_cache_stats() -> dict[str, int]:
    """This process's chunk LRU: size and counters (the KV metrics)."""
    with _lock:
        return {"size": len(_opened), **_stats}
