"""What a request holds is given back when the server is done with it, whether or not a response went out (ASGI).

Django's ASGI handler cancels the request's task when the client disconnects; a response the view returns
after that (a sync view runs on in its thread) is dropped without ``close()``, so nothing it holds would ever
be freed (a streamed answer's slot, its engine seat). ``ClientGoneMiddleware`` wraps the ASGI application
(mnesio_site/asgi.py) and, once Django's handler returns, runs every callback registered for the request
with ``request_on_finish``; one registered later (by a view still running for a client that left) runs at
once. An ASGI wrapper rather than a Django middleware: Django runs a middleware above sync ones in sync mode,
where the cancellation never arrives. Callbacks run on the event loop: they must not block or touch the
database (hand such work to a thread). Under WSGI nothing is cancelled, the server closes every response,
and ``request_on_finish`` says it registered nothing.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("mnesio")

SCOPE_KEY = "mnesio.on_finish"  # the ASGI scope's key holding the request's callbacks (ASGIRequest.scope)


class _Callbacks:
    """The callbacks of one request; thread-safe (the view's thread registers, the event loop runs them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self.finished = False

    def add(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if not self.finished:
                self._callbacks.append(callback)
                return
        _run(callback)  # the request is over already (its client left while the view ran): nothing will send this

    def finish(self) -> None:
        with self._lock:
            self.finished = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _run(callback)


def _run(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:  # one failing clean-up must not keep the others from running
        log.exception("a clean-up at the end of a request failed")


def request_on_finish(request: Any, callback: Callable[[], None]) -> bool:
    """Run ``callback`` once when the server is done with ``request`` (sent, failed, or its client gone).

    Returns False where nothing calls back (WSGI, the test client): the caller relies on the response's close().
    """
    scope = getattr(getattr(request, "_request", request), "scope", None)
    callbacks = scope.get(SCOPE_KEY) if isinstance(scope, dict) else None
    if callbacks is None:
        return False
    callbacks.add(callback)
    return True


Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class ClientGoneMiddleware:
    """ASGI middleware: give every HTTP request a set of end-of-request callbacks and run them when it is over."""

    def __init__(self, app: Callable[[dict, Receive, Send], Awaitable[None]]):
        self.app = app

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        callbacks = _Callbacks()
        scope = {**scope, SCOPE_KEY: callbacks}
        try:
            await self.app(scope, receive, send)
        finally:
            callbacks.finish()
