"""Back-pressure: each process holds a bounded number of asks; past the bound it refuses with 429 + Retry-After.

Decision: the bound is on asks *in flight in this process* (synchronous, streamed, OpenAI-compatible, and
the model-free web tier's asks waiting on a gpu worker), counted with a lock, checked before any work is
done. A refused ask costs a counter check: no queue grows without bound, no request hangs behind a full
engine. The engine's own bound (kvengine.errors.OverloadedError, raised by the batcher when its queue is
full) maps to the same error, so a client sees one shape: 429, ``Retry-After``, and
``{"message", "extra": {"kind": "overloaded", "retry_after_s", "waiting", "limit"}}``.

MNESIO_MAX_WAITING_ASKS (default 32) is per process: a web tier of N processes holds at most N x the bound.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import MnesioError

from .. import conf

_lock = threading.Lock()
_in_flight = 0


class Overloaded(MnesioError):
    """Too many asks are already in flight in this process (or in its engine): ask again after ``retry_after_s``."""

    status_code = 429

    def __init__(self, *, waiting: int, limit: int, retry_after_s: float, where: str = "process"):
        self.retry_after_s = max(1, int(round(retry_after_s)))
        super().__init__(
            f"{waiting} questions are already waiting in this {where} (the limit is {limit}, "
            f"MNESIO_MAX_WAITING_ASKS); ask again in {self.retry_after_s} s",
            extra={"kind": "overloaded", "retry_after_s": self.retry_after_s, "waiting": waiting, "limit": limit},
        )


def overloaded_from_engine(exc: Exception) -> Overloaded:
    """The engine's OverloadedError (its batcher's queue is full) as the application's 429."""
    return Overloaded(waiting=exc.waiting, limit=exc.limit, retry_after_s=exc.retry_after_s, where="engine")


def answer_slot_acquire() -> None:
    """Take one in-flight slot of this process, or raise Overloaded (429) when all are taken."""
    global _in_flight
    limit = conf.max_waiting_asks()
    with _lock:
        if _in_flight >= limit:
            raise Overloaded(waiting=_in_flight, limit=limit, retry_after_s=conf.ask_retry_after_s())
        _in_flight += 1


def answer_slot_release() -> None:
    """Give back a slot taken by answer_slot_acquire (exactly once per acquire)."""
    global _in_flight
    with _lock:
        assert _in_flight > 0, "released more answer slots than were taken"
        _in_flight -= 1


@contextmanager
def answer_slot() -> Iterator[None]:
    """Hold one in-flight slot for the block (Overloaded when none is free)."""
    answer_slot_acquire()
    try:
        yield
    finally:
        answer_slot_release()


def answers_in_flight() -> int:
    """How many asks this process holds now (for tests and metrics)."""
    with _lock:
        return _in_flight


def asks_summary() -> dict[str, int]:
    """This process's asks now, for /api/v1/kv/metrics: slots held and their bound."""
    return {"in_flight": answers_in_flight(), "limit": conf.max_waiting_asks()}
