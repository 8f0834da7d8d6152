"""A request body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is refused before anything reads it, as a JSON 413.

The limit is derived in settings from the documented item limits (a batch of MNESIO_MAX_BATCH_ITEMS memories, each
at every limit, in the worst JSON encoding), so a body within the documented limits (docs/guarantees.md, Limits) always fits. Django itself refuses
a larger body only when something reads ``request.body``, with its HTML "Bad Request" page and no code (and a
chunked one never); this middleware answers from ``Content-Length``, or from the received size of a chunked body: ``{"code": "body_too_large", ...}`` on /api/, OpenAI's error
shape on /v1/. Elsewhere (the admin) Django's own refusal stays.
"""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.errors import ERROR_CODES

CODE = "body_too_large"


def _content_length(request: HttpRequest) -> int | None:
    """The body's size: its ``Content-Length``, or for a chunked body under ASGI the size of what was received."""
    header = request.META.get("CONTENT_LENGTH")
    if header:
        try:
            return int(header)
        except ValueError:  # Django's own parsing of the body then refuses it
            return None
    # A chunked body has no Content-Length, and Django then reads it whole without any limit. Under ASGI (bin/serve)
    # the handler has already spooled the body into a seekable file (ASGIRequest._stream), so its size is known here.
    if not isinstance(request, ASGIRequest):  # WSGI: the stream is the socket's, unread (and unseekable)
        return None
    stream = request._stream
    position = stream.tell()
    stream.seek(0, 2)
    size = stream.tell()
    stream.seek(position)
    return size


def body_too_large_response(request: HttpRequest, *, size: int, limit: int) -> HttpResponse:
    """The 413 for a body of ``size`` bytes over ``limit``: the house shape on /api/, OpenAI's on /v1/."""
    message = (f"`body` has to be at most {limit} bytes (the limit follows the documented item limits: "
               f"{settings.MNESIO_MAX_BATCH_ITEMS} items per batch) but got {size}; send fewer items per request")
    if request.path.startswith("/v1/"):
        from cartridges.api.openai_compat import openai_error

        return JsonResponse(openai_error(413, message, param="body", code=CODE), status=413)
    assert ERROR_CODES[CODE][0] == 413
    return JsonResponse({"code": CODE, "message": message, "extra": {"field": "body", "limit": limit, "size": size}},
                        status=413)


class RequestBodyLimitMiddleware:
    """Refuse an API request whose ``Content-Length`` is over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (see the module)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and request.path.startswith(("/api/", "/v1/")):
            size = _content_length(request)
            if size is not None and size > limit:
                return body_too_large_response(request, size=size, limit=limit)
            if size and not request.META.get("CONTENT_LENGTH"):
                # a chunked body within the limit: DRF reads a body only when Content-Length says it has one
                request.META["CONTENT_LENGTH"] = str(size)
        return self.get_response(request)
