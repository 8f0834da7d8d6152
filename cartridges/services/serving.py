"""What an ask in mode "cartridge" reads: the serving version's cartridge, made fresh in memory when memories were
appended after it (docs/design/asking.md).

Fresh answers: an ask never misses a committed memory. When the scope's head is past the serving version's,
``cartridge_serving`` compiles the scope at its head in memory (never stored) on the scope's stored blocks,
the answer the refreshed version will give. Past MNESIO_FRESH_MAX_MEMORIES memories after the version (or
the model's window) the version answers alone and says how many it did not read. A scope with no version yet
(new, or after a configuration switch) is compiled the same way from nothing when it holds at most
MNESIO_FRESH_MAX_MEMORIES memories; past that, or with none, the ask is NoActiveCartridge (409).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from core.errors import MnesioError
from kvengine.base import Cartridge, KvBackend
from memories.models import Memory
from memories.selectors import scope_head

from .. import conf, engine
from ..models import CartridgeVersion
from ..selectors import active_version
from ..storage import block_lookup, scope_blocks_live
from .blocksecret import scope_block_secret
from .compile import compile_cartridge, compile_input
from .errors import ContextTooLong, NoActiveCartridge, NothingToCompile

log = logging.getLogger("cartridges")


@dataclass(frozen=True)
class Serving:
    """What an ask in mode "cartridge" reads: the serving version's cartridge, or that version's blocks with the
    memories appended after it compiled on top, in memory (module docstring, "Fresh answers"); without a version
    (None), the scope's memories compiled in memory."""

    version: CartridgeVersion | None
    cartridge: Cartridge
    backend: KvBackend
    num_memories_after_version: int = 0  # surviving memories after version.log_head compiled on top of it
    num_memories_unread: int = 0  # memories after version.log_head left out (over the bound, or past the window)
    unread_reason: str = ""

    @property
    def note(self) -> str:
        if self.version is None:
            return (f"read the scope's {self.num_memories_after_version} memories in memory: it has no active version "
                    "yet (its refresh compiles one)")
        if self.num_memories_unread:
            return (f"answered from version {self.version.pk} without the {self.num_memories_unread} memories appended "
                    f"after it ({self.unread_reason}); the refresh catches up")
        if self.num_memories_after_version:
            return (f"read the {self.num_memories_after_version} memories appended after version {self.version.pk} "
                    "on top of its blocks")
        return ""


def cartridge_serving(*, scope, config) -> Serving:
    """The cartridge that answers for ``scope``: the active version's, extended in memory (never stored) with the
    memories appended after it, up to MNESIO_FRESH_MAX_MEMORIES of them; without a version, the scope's memories
    compiled in memory (_serving_from_nothing)."""
    version = active_version(scope=scope, configuration=config)
    if version is None:
        return _serving_from_nothing(scope=scope, config=config)
    head = scope_head(scope=scope)
    if head <= version.log_head:
        cartridge, backend = engine.cartridge_load(version=version, config=config)
        return Serving(version=version, cartridge=cartridge, backend=backend)
    num_after = Memory.objects.filter(scope=scope, seq__gt=version.log_head, seq__lte=head).count()
    limit = conf.fresh_max_memories()
    backend = engine.backend_for(config)
    reason = ""
    if num_after > limit:
        reason = f"more than MNESIO_FRESH_MAX_MEMORIES={limit}"
    elif version.block_size and getattr(backend, "block_size", version.block_size) != version.block_size:
        reason = "the version was cut into blocks of another size: its blocks cannot be reused"
    if reason:
        return _serving_stale(version=version, config=config, num_unread=num_after, reason=reason)
    if not _fresh_slot_take():  # before opening the scope: a refused ask must not decrypt it for nothing
        return _serving_stale(version=version, config=config, num_unread=num_after,
                              reason=f"MNESIO_FRESH_MAX_CONCURRENT={conf.fresh_max_concurrent()} fresh compiles are running")
    try:
        data = compile_input(scope=scope, head=head)  # leaves out every memory whose key is shredded, as a compile does
        num_fresh = sum(1 for seq in data.seqs if seq > version.log_head)
        if not num_fresh:  # every memory after the version was erased since: the version holds the surviving ones
            cartridge, backend = engine.cartridge_load(version=version, config=config)
            return Serving(version=version, cartridge=cartridge, backend=backend)
        try:
            cartridge = compile_cartridge(backend=backend, data=data, blocks=block_lookup(scope=scope, live=scope_blocks_live(scope=scope)),
                                          block_secret=scope_block_secret(scope=scope))
        except ContextTooLong:
            return _serving_stale(version=version, config=config, num_unread=num_fresh,
                                  reason="the scope at its head is over the model's context window")
    finally:
        _fresh_slot_give()
    log.info("fresh answer scope=%s version=%s num_memories_after_version=%d blocks_reused=%s computed_tokens=%s",
             scope.pk, version.pk, num_fresh, cartridge.stats.get("blocks_reused"), cartridge.stats.get("computed_tokens"))
    return Serving(version=version, cartridge=cartridge, backend=backend, num_memories_after_version=num_fresh)


def _serving_from_nothing(*, scope, config) -> Serving:
    """A scope without an active version under ``config``: all its memories compiled in memory (never stored), what a
    compile at its head computes, when they are at most MNESIO_FRESH_MAX_MEMORIES; else NoActiveCartridge (409) saying
    what to do, and FreshCompilesBusy (429) while the process's fresh-compile slots are all taken."""
    head = scope_head(scope=scope)
    num_memories = Memory.objects.filter(scope=scope, seq__lte=head).count()  # erased ones too: opened only below
    limit = conf.fresh_max_memories()
    if num_memories > limit:
        raise _no_cartridge(scope=scope, config=config, why=f", and its {num_memories} memories are more than "
                            f"MNESIO_FRESH_MAX_MEMORIES={limit} to read in memory", num_memories=num_memories)
    if not num_memories:
        raise _no_cartridge(scope=scope, config=config, why=" and no memories; append memories first (an ask reads "
                            "them at once)", num_memories=0)
    if not _fresh_slot_take():  # before opening the scope: a refused ask must not decrypt it for nothing
        raise FreshCompilesBusy(scope=scope)
    try:
        try:
            data = compile_input(scope=scope, head=head)  # leaves out every memory whose key is shredded, as a compile does
        except NothingToCompile:  # every memory was forgotten
            raise _no_cartridge(scope=scope, config=config, why=" and no memories left (all were forgotten); append "
                                "memories first", num_memories=0) from None
        backend = engine.backend_for(config)
        cartridge = compile_cartridge(backend=backend, data=data, blocks=block_lookup(scope=scope, live=scope_blocks_live(scope=scope)),
                                      block_secret=scope_block_secret(scope=scope))
    finally:
        _fresh_slot_give()
    log.info("fresh answer scope=%s version=None num_memories=%d computed_tokens=%s", scope.pk, len(data.seqs),
             cartridge.stats.get("computed_tokens"))
    return Serving(version=None, cartridge=cartridge, backend=backend, num_memories_after_version=len(data.seqs))


def _no_cartridge(*, scope, config, why: str, num_memories: int) -> NoActiveCartridge:
    return NoActiveCartridge(
        f"`scope` '{scope.name}' has no active cartridge under the configuration {config.key()}{why}; compile and "
        "activate one (a refresh does), or ask with mode='text' to re-read the memories",
        extra={"field": "scope", "num_memories": num_memories},
    )


class FreshCompilesBusy(MnesioError):
    """A scope without a version to fall back on found every fresh-compile slot taken: ask again shortly (429)."""

    status_code = 429

    def __init__(self, *, scope):
        self.retry_after_s = max(1, conf.ask_retry_after_s())
        super().__init__(
            f"`scope` '{scope.name}' has no active cartridge yet and this process's "
            f"MNESIO_FRESH_MAX_CONCURRENT={conf.fresh_max_concurrent()} fresh compiles are running; ask again in "
            f"{self.retry_after_s} s",
            extra={"field": "scope", "kind": "overloaded", "retry_after_s": self.retry_after_s},
        )


_fresh_lock = threading.Lock()
_fresh_running = 0  # fresh compiles in this process now (bounded by MNESIO_FRESH_MAX_CONCURRENT)


def _fresh_slot_take() -> bool:
    """Claim one of the process's fresh-compile slots without waiting; False when all are taken."""
    global _fresh_running
    with _fresh_lock:
        if _fresh_running >= conf.fresh_max_concurrent():
            return False
        _fresh_running += 1
        return True


def _fresh_slot_give() -> None:
    global _fresh_running
    with _fresh_lock:
        _fresh_running -= 1


def _serving_stale(*, version, config, num_unread: int, reason: str) -> Serving:
    cartridge, backend = engine.cartridge_load(version=version, config=config)
    return Serving(version=version, cartridge=cartridge, backend=backend, num_memories_unread=num_unread, unread_reason=reason)
