"""The MCP server over streamable HTTP, as an ASGI application (mnesio_site/asgi.py mounts it at ``/mcp``).

Every HTTP request is authenticated here with the API's tokens (``Authorization: Bearer <token>`` or ``Token``,
knox, scope limits included) before the SDK sees it: no or a bad token is a 401 with the API's JSON error body.
A session is bound to the token that opened it. The SDK's session manager is started on the first request and
runs for the life of the process's event loop (ASGI lifespan is off in some deployments).

The Host (and any Origin) header is checked first against Django's ``ALLOWED_HOSTS`` with Django's own rules
(``validate_host``), as every Django view checks it: a refused Host is a 400 ``invalid_input`` (field
``host``). The SDK's own DNS-rebinding check is off in its favour: it allows only loopback hosts by default and
cannot say "a domain and its subdomains".

Sessions are bounded: the SDK's process-wide limit (MNESIO_MCP_MAX_SESSIONS, then its 503) and idle timeout
(MNESIO_MCP_SESSION_IDLE_S), and per user MNESIO_MCP_MAX_SESSIONS_PER_USER (a 429 ``too_many_sessions``), so
one token cannot open every session the process allows and lock out every tenant.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import anyio
from django.conf import settings
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from rest_framework.exceptions import AuthenticationFailed

from core.errors import ERROR_CODES

from .. import conf
from .server import build_server

USER_KEY = "mnesio.user"  # the ASGI scope's key holding the authenticated Django user
PREFIXES = ("bearer", "token")


def token_authentication() -> Any:
    """The project's token authentication class (REST_FRAMEWORK's knox one); the apps never import the project."""
    from knox.auth import TokenAuthentication as KnoxTokenAuthentication
    from rest_framework.settings import api_settings

    return next(c for c in api_settings.DEFAULT_AUTHENTICATION_CLASSES if issubclass(c, KnoxTokenAuthentication))()


def authenticate_key(key: str):
    """``(user, auth_token)`` for an API token's key (its scope limit attached to the user), or AuthenticationFailed."""
    close_old_connections()
    try:
        return token_authentication().authenticate_credentials(key.encode("utf-8"))
    finally:
        close_old_connections()


def _user_from_request(ctx: Context) -> Any:
    request = ctx.request_context.request
    return request.scope[USER_KEY]


async def _refuse(send, code: str, message: str, *, field: str = "authorization", extra: dict | None = None,
                  retry_after_s: int | None = None) -> None:
    body = json.dumps({"code": code, "message": message, "extra": {"field": field, **(extra or {})}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if field == "authorization":
        headers.append((b"www-authenticate", b'Bearer realm="mnesio"'))
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": ERROR_CODES[code][0], "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _allowed_hosts() -> list[str]:
    # as HttpRequest.get_host: with DEBUG on and ALLOWED_HOSTS empty, the local names
    if settings.DEBUG and not settings.ALLOWED_HOSTS:
        return [".localhost", "127.0.0.1", "[::1]"]
    return list(settings.ALLOWED_HOSTS)


def _host_refusal(headers: dict[bytes, bytes]) -> tuple[str, str, str] | None:
    """``(code, message, field)`` when the Host or Origin header names a host ALLOWED_HOSTS does not list."""
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, _allowed_hosts()):
        return "invalid_input", f"the `Host` header {host[:100]!r} is not in ALLOWED_HOSTS", "host"
    origin = headers.get(b"origin")
    if origin is None:
        return None
    origin = origin.decode("latin-1")
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return None
    try:
        origin_domain, _ = split_domain_port(urlsplit(origin).netloc)
    except ValueError:
        origin_domain = ""
    if not origin_domain or not validate_host(origin_domain, _allowed_hosts()):
        return "permission_denied", f"the `Origin` header {origin[:100]!r} is not in ALLOWED_HOSTS", "origin"
    return None


class McpHttpApp:
    """ASGI: authenticate, then hand the request to the SDK's streamable HTTP session manager."""

    def __init__(self) -> None:
        self.server = build_server(_user_from_request)
        # creates the session manager (its Starlette app is not used); Host and Origin are checked in __call__
        self.server.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_sessions=conf.mcp_max_sessions(), session_idle_timeout=conf.mcp_session_idle_s())
        self._opening: Counter[int] = Counter()  # requests without a session id in flight, per user pk
        self._user_of: dict[str, int] = {}  # client id (a token's digest, which owns its sessions) -> its user's pk
        self._started: anyio.Event | None = None
        self._task: asyncio.Task | None = None

    async def _ensure_started(self) -> None:
        if self._started is None:
            self._started = anyio.Event()
            started = self._started

            async def run_manager() -> None:
                async with self.server.session_manager.run():
                    started.set()
                    await anyio.sleep_forever()

            # a task of the loop itself, not of this request: it outlives the request that started it
            self._task = asyncio.get_running_loop().create_task(run_manager())  # referenced: never collected
        await self._started.wait()

    def num_sessions(self, user_pk: int) -> int:
        """Open sessions of the user ``user_pk`` over all their tokens, counting the opening requests in flight
        (a cap per token alone is passed by minting tokens)."""
        # the SDK's record of who opened each open session (mcp 2.3 has no public accessor); a session leaves it
        # however it ends (DELETE, idle timeout, crash, a refused opening request). A session whose opening request
        # is still in flight is counted twice, until that request ends: concurrent openings are refused early, never late
        owners = self.server.session_manager._session_owners.values()
        return sum(self._user_of.get(owner["client_id"]) == user_pk for owner in owners) + self._opening[user_pk]

    async def __call__(self, scope: dict, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
        refusal = _host_refusal(headers)
        if refusal is not None:
            code, message, field = refusal
            await _refuse(send, code, message, field=field)
            return
        raw = headers.get(b"authorization", b"").decode("latin-1").split()
        if len(raw) != 2 or raw[0].lower() not in PREFIXES:
            await _refuse(send, "not_authenticated", "no credentials: send `Authorization: Bearer <token>`")
            return
        try:
            user, auth_token = await anyio.to_thread.run_sync(authenticate_key, raw[1])
        except AuthenticationFailed:
            await _refuse(send, "authentication_failed", "the token is unknown, expired or revoked")
            return
        principal = AccessToken(token="", client_id=auth_token.digest[:32], scopes=[])
        self._user_of[principal.client_id] = user.pk  # a few bytes per token ever seen by this process
        scope = {**scope, "user": AuthenticatedUser(principal), USER_KEY: user}
        await self._ensure_started()
        version = headers.get(b"mcp-protocol-version", b"").decode("latin-1") or None
        if b"mcp-session-id" in headers or (version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS):
            # a request of an open session, or of a sessionless (modern-era) client: it opens nothing (the SDK
            # routes requests the same way)
            await self.server.session_manager.handle_request(scope, receive, send)
            return
        # a request that may open a session: counted and checked with no await in between (one event loop), so
        # concurrent openings by one user cannot pass the cap together
        cap = conf.mcp_max_sessions_per_user()
        if self.num_sessions(user.pk) >= cap:
            idle_s = conf.mcp_session_idle_s()
            await _refuse(send, "too_many_sessions", f"this user holds {cap} open MCP sessions, the most they may "
                          f"(MNESIO_MCP_MAX_SESSIONS_PER_USER, over all their tokens): end one (DELETE with its Mcp-Session-Id) or retry "
                          f"once one has been idle {idle_s} s", field="mcp-session-id", extra={"limit": cap},
                          retry_after_s=min(idle_s, 60))
            return
        self._opening[user.pk] += 1
        try:
            await self.server.session_manager.handle_request(scope, receive, send)
        finally:
            self._opening[user.pk] -= 1
            if not self._opening[user.pk]:
                del self._opening[user.pk]


# One application (one session manager, whose task group lives on one event loop) per event loop: a process
# serves from one loop, but tests start a server (a loop) per test in one process.
_apps: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, McpHttpApp] = weakref.WeakKeyDictionary()


def mcp_http_app() -> McpHttpApp:
    """The MCP HTTP application of the running event loop."""
    loop = asyncio.get_running_loop()
    app = _apps.get(loop)
    if app is None:
        app = _apps[loop] = McpHttpApp()
    return app
