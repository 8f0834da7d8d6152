"""Errors of the cartridge lifecycle; each is a MnesioError the API renders as a 4xx naming what was wrong."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from core.errors import Conflict, MnesioError
from kvengine.errors import ContextTooLongError, OverloadedError

from .admission import overloaded_from_engine


class GateFailed(Conflict):
    """A version did not pass cartridge_is_committable(); ``extra["reasons"]`` lists every reason."""

    def __init__(self, message: str, *, reasons: list[str], version_id: int | None = None, evaluation_id: int | None = None):
        super().__init__(message, extra={"reasons": list(reasons), "version": version_id, "evaluation": evaluation_id})
        self.reasons = list(reasons)


class NoActiveCartridge(Conflict):
    """A scope has no cartridge that may serve (none activated, destroyed, or from another configuration)."""


class NothingToCompile(MnesioError):
    """A scope with no (surviving) memories at the requested head."""


class ContextTooLong(MnesioError):
    """The scope's memories do not fit the model's context window (a refusal: nothing is written)."""

    status_code = 422


@contextmanager
def context_too_long_as_422() -> Iterator[None]:
    """The engine's refusals as application errors: over the window is ContextTooLong (422 on every path, as
    for a compile), a full engine queue (kvengine OverloadedError, from the batcher) is Overloaded (429)."""
    try:
        yield
    except OverloadedError as exc:
        raise overloaded_from_engine(exc) from None
    except ContextTooLongError as exc:
        raise ContextTooLong(
            f"{exc}; ask a shorter question, or split the scope", extra={"field": "question", "num_tokens": exc.num_tokens,
                                                                       "limit": exc.limit, "kind": "context_too_long"},
        ) from None
