"""A request body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is refused before anything reads it, as a JSON 413.

The limit is derived in settings from the documented item limits (a batch of MNESIO_MAX_BATCH_ITEMS memories, each
at every limit, in the worst JSON encoding), so a body within the README's limits always fits. Django itself refuses
a larger body only when something reads ``request.body``, with its HTML "Bad Request" page and no code; this
middleware answers from ``Content-Length`` alone: ``{"code": "body_too_large", ...}`` on /api/, OpenAI's error
shape on /v1/. Elsewhere (the admin) Django's own refusal stays.
"""
from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from core.errors import ERROR_CODES

CODE = "body_too_large"


def _content_length(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:  # Django's own parsing of the body then refuses it
        return None


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
        return self.get_response(request)
