"""A JSON 503 for a request that meets a master key this process does not know (admin, dashboard, any view).

DRF views get the same answer from ``core.errors.exception_handler``; this covers the views DRF
does not handle, so an operator sees what to fix instead of a 500 page (and nothing is echoed but the
variable's name: no key ids, no memory text).
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from core.errors import master_key_unavailable_body
from core.keys import MasterKeyUnavailable

log = logging.getLogger("mnesio")


class MasterKeyUnavailableMiddleware:
    """Render ``core.keys.MasterKeyUnavailable`` raised by a view as ``{"message", "extra"}`` with 503."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, MasterKeyUnavailable):
            return None
        log.error("master key unavailable during %s %s", request.method, request.path)
        return JsonResponse(master_key_unavailable_body(), status=503)
