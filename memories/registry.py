"""Views to rebuild after an erasure: derived views (cartridges) register here; memories never imports them."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memories.models import ErasureRequest

ViewRebuilder = Callable[["ErasureRequest"], None]

_rebuilders: list[ViewRebuilder] = []


def register_view_rebuilder(fn: ViewRebuilder) -> ViewRebuilder:
    """Register ``fn`` to run after a subject's keys are shredded (idempotent; usable as a decorator)."""
    if fn not in _rebuilders:
        _rebuilders.append(fn)
    return fn


def unregister_view_rebuilder(fn: ViewRebuilder) -> None:
    """Remove ``fn`` (tests use it to clean up)."""
    if fn in _rebuilders:
        _rebuilders.remove(fn)


def view_rebuilders() -> list[ViewRebuilder]:
    """Return the registered rebuilders in registration order."""
    return list(_rebuilders)

# Tables of keys wrapped by the master key register in memories.keyring (rotation and verification).


# -- after an append: derived views that follow the log (cartridges' auto-refresh) register here ---------------------
AppendHook = Callable[[int], None]  # called with the scope id whose log grew, after the append's transaction committed

_append_hooks: list[AppendHook] = []


def register_append_hook(fn: AppendHook) -> AppendHook:
    """Register ``fn`` to run after each append (single or batch) that wrote rows commits (idempotent; a decorator too)."""
    if fn not in _append_hooks:
        _append_hooks.append(fn)
    return fn


def unregister_append_hook(fn: AppendHook) -> None:
    """Remove ``fn`` (tests use it to clean up)."""
    if fn in _append_hooks:
        _append_hooks.remove(fn)


def append_hooks() -> list[AppendHook]:
    """Return the registered append hooks in registration order."""
    return list(_append_hooks)
