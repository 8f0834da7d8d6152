"""ASGI entry point: what the production web server runs (``bin/serve``: gunicorn managing uvicorn workers).

ASGI rather than WSGI so that a response can stream (server-sent events on ``/ask/``) without holding a
thread per open stream. Sync views and sync middleware still run in threads: Django gives each request a
thread of its own for them (``ThreadSensitiveContext`` in its ASGI handler), so one worker serves requests
concurrently, while CPU-bound work (model answers) shares the process's cores and GIL; size the number of
worker processes (``MNESIO_WEB_WORKERS``) to the cores. Static files are served by WhiteNoise's middleware (mnesio_site/settings.py) from
``STATIC_ROOT``, which ``bin/serve`` fills with ``collectstatic`` before it starts. Every request ends with
core.disconnect's callbacks, so what a view took for a client that left is given back (a streamed answer's slot).
``/mcp`` is the MCP server's streamable HTTP endpoint (cartridges/mcp_server/http.py), beside Django.
"""
from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mnesio_site.settings")
django_application = get_asgi_application()

from cartridges.mcp_server.http import mcp_http_app  # noqa: E402 - after Django is set up
from core.disconnect import ClientGoneMiddleware  # noqa: E402

MCP_PATH = "/mcp"

django_with_callbacks = ClientGoneMiddleware(django_application)


async def application(scope: dict, receive, send) -> None:
    """``/mcp`` (and below) to the MCP server, everything else to Django."""
    path = scope.get("path", "")
    if scope.get("type") == "http" and (path == MCP_PATH or path.startswith(MCP_PATH + "/")):
        await mcp_http_app()(scope, receive, send)
        return
    await django_with_callbacks(scope, receive, send)
