"""Server-sent events of a streamed answer, served as they are decoded under both WSGI and ASGI.

Under WSGI the response iterates the AnswerStream directly (the server writes and flushes each event). Under
ASGI Django would buffer a sync iterator entirely, turning a stream into one late answer; so there a thread of
its own pumps the stream into an asyncio queue that the response iterates. A client that goes away ends the
response, and under ASGI the ask's slot is given back at once wherever it leaves (mid-stream, before the
response was sent, before the view returned: core.disconnect); the engine generator is closed after the token
in progress.

The events (``/ask/`` with ``"stream": true``; the OpenAI-compatible endpoint renders its own chunks through
the same machinery, see ``Encoder``):

    event: delta    data: {"text": "..."}                        one per decoded token
    event: done     data: {"answer", "version_id", "mode", "ttft_s", "total_s", ...}   the AnswerSerializer body
    event: error    data: {"message": ..., "extra": {..., "status": <the HTTP status it would have had>}}
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from rest_framework import renderers

from core.disconnect import request_on_finish
from core.errors import MnesioError, error_code

from ..services import AnswerResult
from ..services.stream import AnswerStream

log = logging.getLogger("cartridges")


def error_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and ``{"message", "extra"}`` body of an error met mid-stream (no internals for the unexpected)."""
    if isinstance(exc, MnesioError):
        return exc.status_code, {"message": exc.message, "extra": exc.extra}
    try:
        from kvengine.errors import ContextTooLongError, KvError, OverloadedError
    except ImportError:  # pragma: no cover - kvengine is part of the project
        KvError = ()  # type: ignore[assignment]
    if KvError and isinstance(exc, KvError):
        if isinstance(exc, OverloadedError):
            return 429, {"message": str(exc), "extra": {"kind": "overloaded", "retry_after_s": exc.retry_after_s}}
        return (422 if isinstance(exc, ContextTooLongError) else 400), {"message": str(exc), "extra": {"kind": type(exc).__name__}}
    return 500, {"message": "the answer failed on the server; it was logged, ask again", "extra": {"kind": "error"}}


class Encoder:
    """How a stream's items become bytes (this one: mnesio's SSE events; OpenAI's chunks subclass it)."""

    def start(self) -> Iterator[bytes]:
        return iter(())

    def delta(self, text: str) -> bytes:
        return sse("delta", {"text": text})

    def done(self, result: AnswerResult) -> bytes:
        from .serializers import AnswerSerializer

        return sse("done", AnswerSerializer(result).data)

    def error(self, exc: BaseException) -> bytes:
        status, body = error_body(exc)
        body = {"code": error_code(exc, status_code=status, kind=body.get("extra", {}).get("kind")), **body,
                "extra": {**body.get("extra", {}), "status": status}}
        return sse("error", body)

    def end(self) -> Iterator[bytes]:
        return iter(())


def sse(event: str | None, data: Any) -> bytes:
    """One server-sent event (``data`` as one line of JSON, or as is when already text)."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class EventStreamRenderer(renderers.BaseRenderer):
    """A response the view returns itself (not a stream) to a client that accepts only ``text/event-stream``
    (EventSource, most SSE libraries): one ``error`` event for a refusal (its status kept in ``extra.status``,
    as mid-stream), else one ``done`` event with the body. Without it such a client got a 406."""

    media_type = "text/event-stream"
    format = "sse"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: dict | None = None) -> bytes:
        response = (renderer_context or {}).get("response")
        status = getattr(response, "status_code", 200)
        if status >= 400 and isinstance(data, dict):
            return sse("error", {**data, "extra": {**(data.get("extra") or {}), "status": status}})
        return sse("done", data)


def events(stream: AnswerStream, encoder: Encoder) -> Iterator[bytes]:
    """The stream's events; an error after the first byte becomes an error event; always closes the stream."""
    failed = False
    try:
        yield from encoder.start()
        for item in stream:
            yield encoder.delta(item) if isinstance(item, str) else encoder.done(item)
    except Exception as exc:  # after the status line went out: the error is an event
        failed = True
        if not isinstance(exc, MnesioError):
            log.exception("streamed answer failed: %s", type(exc).__name__)
        yield encoder.error(exc)
    finally:
        stream.close()
    if not failed:
        yield from encoder.end()


class AsyncEvents:
    """``events`` run in a thread of its own, passed to the event loop event by event (ASGI).

    ``close()`` (the response's, which Django calls once the server is done with it, sent or not) abandons the
    stream: an answer whose response never got its first byte out gives its slot back too.
    """

    def __init__(self, stream: AnswerStream, encoder: Encoder):
        self.stream = stream
        self.encoder = encoder

    def close(self) -> None:
        self.stream.abandon()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream, encoder = self.stream, self.encoder
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        stop = threading.Event()

        def put(item: bytes | None) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed (server shutting down): nobody reads any more
                stop.set()

        def pump() -> None:
            from django.db import connections

            produced = events(stream, encoder)
            try:
                for chunk in produced:
                    if stop.is_set():
                        break
                    put(chunk)
            finally:
                produced.close()  # closes the AnswerStream here, in the thread that iterated it
                connections.close_all()  # this thread's database connections end with it
                put(None)

        threading.Thread(target=pump, name="mnesio-answer-stream", daemon=True).start()
        try:
            while (chunk := await queue.get()) is not None:
                yield chunk
        finally:  # the end, or the client went away (Django cancels this iterator)
            stop.set()
            stream.abandon()  # the slot now; the pump closes the engine generator after the token in progress


def streaming_response(request: Any, stream: AnswerStream, encoder: Encoder | None = None) -> StreamingHttpResponse:
    """A ``text/event-stream`` response of ``stream``: async under ASGI, sync under WSGI (module docstring)."""
    encoder = encoder or Encoder()
    raw = getattr(request, "_request", request)
    if isinstance(raw, ASGIRequest):
        content: Any = AsyncEvents(stream, encoder)
        # a client gone before this response reached the server: Django drops it unclosed (core.disconnect)
        request_on_finish(raw, stream.abandon)
    else:
        content = events(stream, encoder)
    response = StreamingHttpResponse(content, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass events on as they come
    return response
