"""One application error type, rendered by one DRF exception handler as ``{"code", "message", "extra"}``.

``code`` is the stable, machine-readable key a client switches on; every value is listed in ``ERROR_CODES``.
``error_code`` finds it, most specific first: a ``code=`` given when raising, ``extra["kind"]`` when it
names a registered code, DRF's own code or the snake_case name of the error's class (or a base, CLASS_CODES),
else the generic code of its HTTP status. So every error class of every app gets a code without importing
anything here (core must not import the apps).

Design: docs/design/errors.md.
"""
from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.keys import MasterKeyUnavailable

log = logging.getLogger("mnesio")


# Every ``code`` an error body may carry, with its usual status and what a client does about it. Stable: a code
# is never renamed or reused (tests/api/test_error_codes.py checks each is produced and each produced is here).
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_input": (400, "a value in the body, query or path is wrong; `extra.field` (or `extra.fields`) names it"),
    "not_authenticated": (401, "no credentials: send `Authorization: Bearer <token>` (or `Token <token>`)"),
    "authentication_failed": (401, "the token is unknown, expired or revoked"),
    "permission_denied": (403, "authenticated, but this action needs a permission the user lacks"),
    "not_found": (404, "no such object, or a scope not granted to you (answered alike on purpose)"),
    "method_not_allowed": (405, "the route does not accept this HTTP method"),
    "not_acceptable": (406, "the `Accept` header asks for a format the API does not produce (it answers JSON)"),
    "unsupported_media_type": (415, "the body's `Content-Type` is not JSON"),
    "body_too_large": (413, "the request body is over the server's limit (`extra.limit` bytes, derived from the "
                            "documented item limits); send fewer items per batch"),
    "conflict": (409, "the request conflicts with the stored state (a reused idempotency key with other content, "
                      "an erased subject, a duplicate name); the message says which"),
    "gate_failed": (409, "the cartridge version did not pass the gate; `extra.reasons` lists why"),
    "no_active_cartridge": (409, "the scope has no cartridge that may serve; compile and activate one, or ask with "
                                 "`mode: text`"),
    "nothing_to_compile": (400, "the scope has no (surviving) memories at the requested head"),
    "context_too_long": (422, "the memories or the question do not fit the model's context window"),
    "erased_during_compile": (409, "subjects were erased during every compile attempt; ask for the compile again"),
    "legacy_subject_needs_operator": (409, "the subject predates per-scope subjects: an operator erases it everywhere"),
    "blob_unavailable": (409, "the cartridge's stored blob or its key is gone; rebuild the version"),
    "blob_tampered": (409, "the cartridge's stored bytes fail their checks and are never served"),
    "blob_storage_unavailable": (503, "blob storage refused a write; retry once it is fixed"),
    "version_pruned": (409, "the version was pruned by the scope's retention (keep_previous_versions); compile instead"),
    "memory_integrity": (500, "a stored memory failed authentication (altered or copied ciphertext)"),
    "engine_refused": (400, "the KV engine refused the input; the message says why"),
    "already_erased": (409, "the memory is erased already (its subject was erased or its scope deleted): nothing to forget"),
    "overloaded": (429, "the answering engine is at capacity; retry after `Retry-After` seconds"),
    "too_many_pending_asks": (429, "too many async asks wait for an answer (this process's or this user's); collect "
                                   "them, or retry after `Retry-After` seconds"),
    "too_many_sessions": (429, "this token holds the most MCP sessions it may keep open; end one (DELETE /mcp with its "
                               "session id) or retry after `Retry-After` seconds, when an idle one has closed"),
    "worker_timeout": (504, "no gpu worker answered in time (none running, or all busy); retry after `Retry-After` seconds"),
    "database_unavailable": (503, "the database is unreachable; retry with the same idempotency key"),
    "master_key_unavailable": (503, "the server's master key does not open the stored keys; an operator must fix it"),
    "error": (500, "an error without a more specific code; switch on the HTTP status"),
}
# The generic code of a status, for an error whose class and kind name no registered code.
STATUS_CODES: dict[int, str] = {
    400: "invalid_input", 401: "not_authenticated", 403: "permission_denied", 404: "not_found",
    405: "method_not_allowed", 406: "not_acceptable", 409: "conflict", 415: "unsupported_media_type",
    429: "overloaded",
}


# Classes whose snake_case name is not their code (matched by name: core imports neither the engine nor the apps).
CLASS_CODES = {"ValidationError": "invalid_input", "KvError": "engine_refused"}


def _snake(name: str) -> str:
    """``ContextTooLongError`` -> ``context_too_long`` (class names and class-name kinds to codes)."""
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()
    return snake[: -len("_error")] if snake.endswith("_error") else snake


def error_code(exc: BaseException, *, status_code: int | None = None, kind: Any = None) -> str:
    """The stable ``code`` of an error (see the module docstring for the order); always a key of ERROR_CODES.

    ``kind``: the ``extra.kind`` of the rendered body, for errors rendered without an ``extra`` of their own
    (a lost database connection).
    """
    explicit = getattr(exc, "code", None)
    if isinstance(explicit, str) and explicit in ERROR_CODES:
        return explicit
    kind = (getattr(exc, "extra", None) or {}).get("kind") or kind
    if isinstance(kind, str):
        for candidate in (kind, _snake(kind)):
            if candidate in ERROR_CODES:
                return candidate
    drf_codes = exc.get_codes() if isinstance(exc, APIException) else None
    if isinstance(drf_codes, str) and drf_codes in ERROR_CODES:  # not_authenticated, method_not_allowed, ...
        return drf_codes
    for cls in type(exc).__mro__:
        if cls in (MnesioError, Exception, BaseException, object):
            break
        candidate = CLASS_CODES.get(cls.__name__) or _snake(cls.__name__)
        if candidate in ERROR_CODES:
            return candidate
    status_code = status_code if status_code is not None else getattr(exc, "status_code", 500)
    return STATUS_CODES.get(status_code, "error")


class MnesioError(Exception):
    """An error a client can act on: a message naming what was wrong, plus structured extras.

    ``code`` (optional) is one of ERROR_CODES; without it the code is derived (see ``error_code``).
    """

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, *, extra: dict[str, Any] | None = None, status_code: int | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.message = message
        self.extra = extra or {}
        if status_code is not None:
            self.status_code = status_code
        if code is not None:
            if code not in ERROR_CODES:
                raise ValueError(f"`code` has to be one of ERROR_CODES (core/errors.py) but got {code!r}")
            self.code = code


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
        "code": "master_key_unavailable",
        "message": "the server's master key (`MNESIO_MASTER_KEY`) does not open the keys stored for this data, so "
        "the request was refused and nothing was written; an operator has to start the service with the right "
        "`MNESIO_MASTER_KEY` (see `manage.py check --database default`)",
        "extra": {"kind": "master_key_unavailable", "variable": "MNESIO_MASTER_KEY"},
    }


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: render the error (``_error_response``), then give its body the stable ``code``.

    The code is added here, once, for every branch (and any branch added later), rather than in each body.
    """
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()  # as DRF does, but as an APIException: {"message", "extra"}, not {"detail"}
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = _error_response(exc, context)
    if response is not None and isinstance(response.data, dict) and "message" in response.data:
        extra = response.data.get("extra")
        kind = extra.get("kind") if isinstance(extra, dict) else None
        response.data = {"code": error_code(exc, status_code=response.status_code, kind=kind), **response.data}
    return response


def _error_response(exc: Exception, context: dict[str, Any]) -> Response | None:
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


def api_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404: a path under /api/ that matches no route (``/cartridges/abc/``) is a JSON 404 with a code, like
    every other API error; elsewhere Django's own page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"code": "not_found", "message": f"`path` {request.path!r} is not an API route",
                             "extra": {"field": "path"}}, status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
