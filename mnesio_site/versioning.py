"""API versioning: /api/v1/ is the API; /api/ is a deprecated alias of the same views (mnesio_site.urls).

Why an alias and not a redirect: clients POST, and a 301/308 on a POST is followed unevenly by HTTP
libraries; serving the same views keeps every existing client working byte for byte while the schema,
the docs and a response header point them at /api/v1/. The header pair is RFC 9745's ``Deprecation``
and RFC 8288's ``Link`` with ``rel="successor-version"``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse

UNVERSIONED_NAMESPACE = "api-unversioned"
API_PREFIX = "/api/"
V1_PREFIX = "/api/v1/"


def v1_endpoints_only(endpoints: list[tuple[str, str, str, Any]], **kwargs: Any) -> list[tuple[str, str, str, Any]]:
    """drf-spectacular preprocessing hook: document /api/v1/ and leave the /api/ alias out (it is the same API)."""
    return [
        endpoint
        for endpoint in endpoints
        if not endpoint[0].startswith(API_PREFIX) or endpoint[0].startswith(V1_PREFIX)
    ]


class AliasDeprecationMiddleware:
    """Mark every response served through the unversioned alias as deprecated, naming its /api/v1/ successor."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        if match is not None and UNVERSIONED_NAMESPACE in match.namespaces:
            response["Deprecation"] = "true"
            successor = V1_PREFIX + request.path[len(API_PREFIX):]
            response["Link"] = f'<{successor}>; rel="successor-version"'
        return response


def unversioned_operation_ids(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: keep the operationIds the API had before /api/v1/ (`api_scopes_list`).

    Generated clients name their methods after operationIds; moving the documented paths under /api/v1/
    must not rename every method of every client.
    """
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict) and operation.get("operationId", "").startswith("api_v1_"):
                operation["operationId"] = "api_" + operation["operationId"][len("api_v1_"):]
    return result
