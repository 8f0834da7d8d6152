"""Errors of the cartridge lifecycle; each is a MnesioError the API renders as a 4xx naming what was wrong."""
from __future__ import annotations

from core.errors import Conflict, MnesioError


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
