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
