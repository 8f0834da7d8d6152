"""Back-pressure: each process holds a bounded number of asks; past the bound it refuses with 429 + Retry-After.

The bound is on asks in flight in this process (synchronous, streamed, OpenAI-compatible, and the model-free
web tier's asks waiting on a gpu worker), counted under a lock before any work is done: a refused ask costs a
counter check, and no queue grows without bound. The engine's own bound (kvengine.errors.OverloadedError)
maps to the same error, so a client sees one shape: 429, ``Retry-After``, and ``{"message", "extra": {"kind":
"overloaded", "retry_after_s", "waiting", "limit"}}``. MNESIO_MAX_WAITING_ASKS (default 32) is per process.

Async asks (``"async": true``) hold no slot (they return 202 at once), so they have bounds of their own:
MNESIO_MAX_PENDING_ASYNC_ASKS filed by this process and not yet answered, and
MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER unanswered requests of one user (every token and process; the database
counts). Past either: 429 + Retry-After, code ``too_many_pending_asks``. The check and the filing run under
this process's lock, so N processes filing for one user at once may overshoot the per-user bound by N - 1.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

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


class TooManyPendingAsks(MnesioError):
    """Too many async asks wait for a gpu worker (this process's, or this user's): ask again after ``retry_after_s``."""

    status_code = 429
    code = "too_many_pending_asks"

    def __init__(self, *, pending: int, limit: int, setting: str, whose: str, retry_after_s: int):
        self.retry_after_s = retry_after_s
        super().__init__(
            f"{pending} async questions {whose} are still waiting to be answered (the limit is {limit}, {setting}); "
            f"collect them or ask again in {retry_after_s} s",
            extra={"kind": "too_many_pending_asks", "retry_after_s": retry_after_s, "pending": pending,
                   "limit": limit, "setting": setting},
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


_async_lock = threading.Lock()
_async_pending: set[int] = set()  # AnswerRequest ids this process filed that were unanswered when last looked at


def _unanswered(queryset: Any) -> Any:
    from django.utils import timezone

    cutoff = timezone.now() - timedelta(seconds=conf.answer_request_ttl_s())  # older ones are swept, not answered
    return queryset.filter(answered_at__isnull=True, created_at__gt=cutoff)


def async_ask_admit(*, user: Any, file: Callable[[], Any]) -> Any:
    """Run ``file`` (which files an AnswerRequest) if this process and ``user`` are under their async bounds."""
    from ..models import AnswerRequest

    retry_after = conf.ask_retry_after_s()
    with _async_lock:
        mine = set(_unanswered(AnswerRequest.objects.filter(pk__in=_async_pending)).values_list("pk", flat=True))
        _async_pending.intersection_update(mine)  # answered, collected, withdrawn or expired: no longer waiting
        limit = conf.max_pending_async_asks()
        if len(_async_pending) >= limit:
            raise TooManyPendingAsks(pending=len(_async_pending), limit=limit, setting="MNESIO_MAX_PENDING_ASYNC_ASKS",
                                     whose="filed through this process", retry_after_s=retry_after)
        per_user = conf.max_pending_async_asks_per_user()
        pending = _unanswered(AnswerRequest.objects.filter(actor_id=user.pk)).count()
        if pending >= per_user:
            raise TooManyPendingAsks(pending=pending, limit=per_user, setting="MNESIO_MAX_PENDING_ASYNC_ASKS_PER_USER",
                                     whose="of this user", retry_after_s=retry_after)
        request = file()
        _async_pending.add(request.pk)
    return request


def async_asks_pending() -> int:
    """How many async asks this process filed were unanswered when it last looked (for metrics)."""
    with _async_lock:
        return len(_async_pending)


def asks_summary() -> dict[str, int]:
    """This process's asks now, for /api/v1/kv/metrics: slots held and their bound, async asks waiting and theirs."""
    return {"in_flight": answers_in_flight(), "limit": conf.max_waiting_asks(),
            "async_pending": async_asks_pending(), "async_limit": conf.max_pending_async_asks()}
