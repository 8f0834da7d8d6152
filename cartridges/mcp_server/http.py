"""The MCP server over streamable HTTP, as an ASGI application (mnesio_site/asgi.py mounts it at ``/mcp``).

Every HTTP request is authenticated here with the API's tokens (``Authorization: Bearer <token>`` or ``Token``,
the project's knox authentication, scope limits included) before the SDK sees it: no or a bad token is a 401 with
the API's JSON error body. A session is bound to the token that opened it (the SDK answers another credential 404).
The SDK's session manager needs a running task group; ASGI lifespan is off in some deployments (the test server)
and Django's application does not speak it, so the manager is started on the first request and runs for the
life of the process's event loop.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

import anyio
from django.db import close_old_connections
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context
from rest_framework.exceptions import AuthenticationFailed

from core.errors import ERROR_CODES

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


async def _refuse(send, code: str, message: str) -> None:
    body = json.dumps({"code": code, "message": message, "extra": {"field": "authorization"}}).encode()
    await send({"type": "http.response.start", "status": ERROR_CODES[code][0], "headers": [
        (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="mnesio"'),
        (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class McpHttpApp:
    """ASGI: authenticate, then hand the request to the SDK's streamable HTTP session manager."""

    def __init__(self) -> None:
        self.server = build_server(_user_from_request)
        self.server.streamable_http_app()  # creates the session manager (its Starlette app is not used)
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

    async def __call__(self, scope: dict, receive, send) -> None:
        headers = dict(scope.get("headers") or [])
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
        scope = {**scope, "user": AuthenticatedUser(principal), USER_KEY: user}
        await self._ensure_started()
        await self.server.session_manager.handle_request(scope, receive, send)


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
