"""The log counter's lock: the first lock of every write that must be ordered against appends.

One order of locks everywhere: the log counter (LogHead), then subject rows, then own keys (MemoryKey); a
compile's store locks subjects, then own keys (cartridges.services.compile). Taking them in another order
deadlocks with an append.
"""
from __future__ import annotations

from memories.models import LogHead


def log_counter_lock() -> None:
    """Hold the log counter's lock until the transaction ends: no append runs (nor wraps keys) meanwhile."""
    list(LogHead.objects.select_for_update().filter(pk=1).values_list("pk", flat=True))
