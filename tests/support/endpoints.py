"""Every URL pattern of the project, enumerated from the resolver, so a new endpoint cannot be forgotten.

The isolation and hostile-input tests iterate over ``all_routes()``; ``classify()`` puts each route in
exactly one class and raises for a route no class knows, which fails the matrix test until someone
says how the new endpoint is protected.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from django.urls import URLPattern, URLResolver, get_resolver

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


@dataclass(frozen=True)
class Route:
    """One URL pattern: its route text, name, the view's HTTP methods and the path parameters it takes."""

    route: str
    name: str | None
    methods: tuple[str, ...]
    params: tuple[str, ...]

    def url(self, **values: object) -> str:
        """Fill the path parameters (``<str:scope>`` etc.) and return an absolute path."""
        path = self.route
        for name in self.params:
            path = re.sub(rf"<(?:\w+:)?{name}>", str(values[name]), path)
        path = path.replace("^", "").replace("/?$", "/").replace("$", "")
        return "/" + path


def _methods(callback) -> tuple[str, ...]:
    cls = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if cls is None:
        return ("get", "post")  # a function view (admin, pages): it decides per method itself
    return tuple(m for m in HTTP_METHODS if hasattr(cls, m))


def _walk(patterns, prefix: str = ""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p


def all_routes() -> list[Route]:
    """Every URL pattern the project serves (admin, API, pages)."""
    routes = []
    for route, pattern in _walk(get_resolver().url_patterns):
        params = tuple(re.findall(r"<(?:\w+:)?(\w+)>", route)) + tuple(re.findall(r"\(\?P<(\w+)>", route))
        routes.append(Route(route=route, name=pattern.name, methods=_methods(pattern.callback), params=params))
    return routes


# Unscoped API and page routes, with how each keeps scopes apart (checked by test_isolation).
UNSCOPED_API = {
    "api/schema/": "any logged-in user (token or session): the OpenAPI document, no data",
    "api/docs/": "any logged-in user (token or session): the Swagger page, no data",
    "api/redoc/": "any logged-in user (token or session): the Redoc page, no data",
    "api/scopes/": "lists only the caller's granted scopes; creating one needs staff with memories.add_scope",
    "api/kv/configuration/": "reads the global configuration (no scope data); writes need staff",
    "api/^kv/metrics/?$": "clients see only their own scopes",
    # a user's own tokens (tests/memories/test_self_service.py): another user's token id is a 404
    "api/tokens/": "lists and creates only the caller's own tokens, limited to scopes the caller is granted",
    "api/tokens/<str:token_id>/": "revokes only the caller's own token (another user's id: 404 like unknown)",
    "api/users/": "staff with auth.add_user, unlimited token (scopes: + add_scopegrant, grant_scope_to_self)",
    # the same views under /api/v1/ (mnesio_site.urls: /api/ is the deprecated alias of /api/v1/)
    "api/v1/tokens/": "lists and creates only the caller's own tokens, limited to scopes the caller is granted",
    "api/v1/tokens/<str:token_id>/": "revokes only the caller's own token (another user's id: 404 like unknown)",
    "api/v1/users/": "staff with auth.add_user, unlimited token (scopes: + add_scopegrant, grant_scope_to_self)",
    "api/v1/scopes/": "lists only the caller's granted scopes; creating one needs staff with memories.add_scope",
    "api/v1/kv/configuration/": "reads the global configuration (no scope data); writes need staff",
    "api/v1/^kv/metrics/?$": "clients see only their own scopes",
    "": "redirects to the dashboard",
    "dashboard/": "staff only",
    "metrics": "clients see only their own scopes",
    # OpenAI-compatible (tests/serving/test_openai.py): ``model`` is resolved by scope_get_for_user like /api/
    "v1/chat/completions": "model is a scope name resolved with the caller's grants (ungranted: 404 like unknown)",
    "v1/models": "lists only the caller's granted scopes",
    "v1/completions": "model is a scope name resolved with the caller's grants (ungranted: 404 like unknown)",
    "v1/models/<str:model>": "model is a scope name resolved with the caller's grants (ungranted: 404 like unknown)",
    "v1/^.*$": "any other /v1/ path: an OpenAI-shaped 404, no data",
}


def classify(route: Route) -> str:
    """Return 'scoped-api', 'unscoped', 'admin' or raise for a route nobody has classified yet."""
    if route.route.startswith("admin/"):
        return "admin"
    if route.route.startswith("api/") and "scope" in route.params:
        return "scoped-api"
    if route.route in UNSCOPED_API:
        return "unscoped"
    raise AssertionError(
        f"route {route.route!r} ({route.name}) is not in the isolation matrix: add it to "
        "tests/support/endpoints.py (UNSCOPED_API) with how it keeps scopes apart, and test it"
    )
