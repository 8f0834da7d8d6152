"""One application error type, rendered by one DRF exception handler as ``{"message", "extra"}``."""
from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.keys import MasterKeyUnavailable

log = logging.getLogger("mnesio")


class MnesioError(Exception):
    """An error a client can act on: a message naming what was wrong, plus structured extras."""

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, *, extra: dict[str, Any] | None = None, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if status_code is not None:
            self.status_code = status_code


class NotFound(MnesioError):
    status_code = status.HTTP_404_NOT_FOUND


class PermissionDenied(MnesioError):
    status_code = status.HTTP_403_FORBIDDEN


class Conflict(MnesioError):
    status_code = status.HTTP_409_CONFLICT


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    """Turn DRF's nested error detail into 'field: message' strings."""
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_flatten(value, name))
        return out
    if isinstance(detail, list):
        out = []
        for i, value in enumerate(detail):
            name = prefix if not isinstance(value, (dict, list)) else f"{prefix}[{i}]"
            out.extend(_flatten(value, name))
        return out
    return [f"`{prefix}`: {detail}" if prefix and prefix != "non_field_errors" else str(detail)]


# How long a client should wait before retrying after the database went away (a restart, a failover).
DATABASE_RETRY_AFTER_S = 5


def _database_unavailable(exc: DatabaseError) -> Response:
    """A 503 for an operational database failure (connection lost, refused, timed out): retry the request as it was."""
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    # the class and SQLSTATE only: a driver message may quote parameters, and those can be memory text
    log.warning("database unavailable during a request: %s sqlstate=%s", type(exc).__name__, sqlstate)
    return Response(
        {
            "message": "the database is unavailable for now (a lost or refused connection, a restart, a lock or "
            "statement timeout), so this request may or may not have been applied; retry in "
            f"{DATABASE_RETRY_AFTER_S} s with the same idempotency_key (an append that did commit is then "
            "answered with its original row, not written twice)",
            "extra": {"kind": "database_unavailable", "error": type(exc).__name__, "sqlstate": sqlstate,
                      "retry_after_s": DATABASE_RETRY_AFTER_S},
        },
        status=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
    )


def master_key_unavailable_body() -> dict[str, Any]:
    """The 503 body for a request that met a wrapped key this process's master key cannot open.

    It names the variable to fix, not the key ids (those are in the server log and in
    ``manage.py check --database default``): a client can do nothing about it but wait for an operator.
    """
    return {
        "message": "the server's master key (`MNESIO_MASTER_KEY`) does not open the keys stored for this data, so "
        "the request was refused and nothing was written; an operator has to start the service with the right "
        "`MNESIO_MASTER_KEY` (see `manage.py check --database default`)",
        "extra": {"kind": "master_key_unavailable", "variable": "MNESIO_MASTER_KEY"},
    }


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render MnesioError, engine errors, lost database connections and DRF errors as ``{"message", "extra"}``."""
    if isinstance(exc, MnesioError):
        # back-pressure (cartridges.services.admission.Overloaded) says when to come back
        retry_after = getattr(exc, "retry_after_s", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return Response({"message": exc.message, "extra": exc.extra}, status=exc.status_code, headers=headers)
    if isinstance(exc, MasterKeyUnavailable):
        log.error("master key unavailable during a request: %s", exc)
        return Response(master_key_unavailable_body(), status=status.HTTP_503_SERVICE_UNAVAILABLE)
    if isinstance(exc, (OperationalError, InterfaceError)):
        return _database_unavailable(exc)
    try:
        from kvengine.errors import KvError
    except ImportError:  # the engine is optional for the log-only parts
        KvError = ()  # type: ignore[assignment]
    if KvError and isinstance(exc, KvError):
        # an engine refusal that no service turned into an application error: over the window is a 422 on
        # every path (cartridges.services ContextTooLong), anything else the engine refuses is a 400
        from kvengine.errors import ContextTooLongError, OverloadedError

        if isinstance(exc, OverloadedError):  # the engine's queue is full: come back later, as for the web's own bound
            retry_after = max(1, int(round(exc.retry_after_s)))
            return Response({"message": str(exc), "extra": {"kind": "overloaded", "retry_after_s": retry_after,
                                                           "waiting": exc.waiting, "limit": exc.limit}},
                            status=status.HTTP_429_TOO_MANY_REQUESTS, headers={"Retry-After": str(retry_after)})
        code = status.HTTP_422_UNPROCESSABLE_ENTITY if isinstance(exc, ContextTooLongError) else status.HTTP_400_BAD_REQUEST
        return Response({"message": str(exc), "extra": {"kind": type(exc).__name__}}, status=code)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ValidationError):
        messages = _flatten(exc.detail)
        response.data = {"message": "; ".join(messages), "extra": {"fields": exc.detail}}
    elif isinstance(exc, APIException):
        response.data = {"message": str(exc.detail), "extra": {"code": exc.get_codes()}}
    return response
