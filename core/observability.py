"""Logs an operator can correlate and request latency a scraper can aggregate: JSON log lines (structlog), a request
id that follows a request into the Celery tasks it queues, and a request-latency histogram per route.

``JsonFormatter`` renders every stdlib record as one JSON object per line with what the context binds
(``MNESIO_LOG_FORMAT=plain`` for a terminal); ``RequestIdMiddleware`` takes a well-formed ``X-Request-ID`` or
makes one, and Celery's publish and prerun signals carry it into tasks as a header. The latency histogram is
labelled by route name, method and status class, never by path. No memory text is ever bound or logged here.

Design: docs/design/observability.md.
"""
from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse
from prometheus_client import Histogram

REQUEST_ID_HEADER = "X-Request-ID"
CELERY_HEADER = "mnesio_request_id"
REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

# 1 ms (a cached read) to 60 s (a long text re-read on CPU), roughly x2-x2.5 per step.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Not in prometheus_client's global registry: each scrape registers it (cartridges.prometheus.registry_for).
HTTP_REQUEST_DURATION = Histogram(
    "mnesio_http_request_duration_seconds", "HTTP request latency per route name, method and status class.",
    ["route", "method", "status"], buckets=REQUEST_BUCKETS, registry=None,
)

# What every line carries, for structlog's own loggers and for stdlib records alike.
_SHARED_PROCESSORS: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class JsonFormatter(structlog.stdlib.ProcessorFormatter):
    """A logging.Formatter that renders each record as one JSON line with the bound context (see the docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(
            *args,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                structlog.processors.JSONRenderer(sort_keys=False),
            ],
            foreign_pre_chain=_SHARED_PROCESSORS,
            **kwargs,
        )


def structlog_configure() -> None:
    """Route structlog's own loggers through the stdlib handlers (so both kinds of call end up as the same JSON)."""
    structlog.configure(
        processors=[*_SHARED_PROCESSORS, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def request_id_from(value: str | None) -> str:
    """The client's request id when well formed, else a fresh one."""
    if value and REQUEST_ID_RE.match(value):
        return value
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    """The request id bound in this context (a request, or a task that one queued), if any."""
    return structlog.contextvars.get_contextvars().get("request_id")


class RequestIdMiddleware:
    """Bind a request id for the request's log lines, return it as ``X-Request-ID``, and time the request."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_from(request.headers.get(REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        tokens = structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
        finally:
            structlog.contextvars.reset_contextvars(**tokens)
        match = getattr(request, "resolver_match", None)
        # the URL pattern's name without its namespace: /api/v1/ and its deprecated /api/ alias are one route
        route = (match.url_name if match is not None else None) or "unmatched"
        HTTP_REQUEST_DURATION.labels(route=route, method=request.method or "-",
                                     status=f"{response.status_code // 100}xx").observe(time.perf_counter() - started)
        response[REQUEST_ID_HEADER] = request_id
        if getattr(response, "streaming", False):
            # a streamed body (server-sent events) is produced after this returns: keep the id bound while it is
            response.streaming_content = _bound_stream(response.streaming_content, request_id)
        return response


def _bound_stream(content: Any, request_id: str) -> Any:
    """Iterate ``content`` (sync or async) with ``request_id`` bound for the log lines written meanwhile."""
    if hasattr(content, "__aiter__"):
        async def bound_async() -> Any:
            structlog.contextvars.bind_contextvars(request_id=request_id)
            try:
                async for chunk in content:
                    yield chunk
            finally:
                structlog.contextvars.unbind_contextvars("request_id")

        return bound_async()

    def bound() -> Any:
        structlog.contextvars.bind_contextvars(request_id=request_id)
        try:
            yield from content
        finally:
            structlog.contextvars.unbind_contextvars("request_id")

    return bound()


# ---------------------------------------------------------------------------
# Celery: the request id travels as a message header (see the module docstring)
# ---------------------------------------------------------------------------
def _task_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
    request_id = current_request_id()
    if request_id and headers is not None:
        headers.setdefault(CELERY_HEADER, request_id)


def _task_prerun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    request = getattr(task, "request", None)
    header = getattr(request, CELERY_HEADER, None) or (getattr(request, "headers", None) or {}).get(CELERY_HEADER)
    values: dict[str, Any] = {"task_id": task_id, "task": getattr(task, "name", None)}
    if header and not getattr(request, "is_eager", False) and REQUEST_ID_RE.match(str(header)):
        values["request_id"] = str(header)
    structlog.contextvars.bind_contextvars(**values)


def _task_postrun(task: Any = None, **_: Any) -> None:
    request = getattr(task, "request", None)
    names = ["task_id", "task"]
    if not getattr(request, "is_eager", False):
        names.append("request_id")  # a worker's next task must not inherit it; eager tasks keep the request's
    structlog.contextvars.unbind_contextvars(*names)


def celery_signals_connect() -> None:
    """Connect the publish/prerun/postrun handlers (idempotent: dispatch uids)."""
    from celery.signals import before_task_publish, task_postrun, task_prerun

    before_task_publish.connect(_task_publish, dispatch_uid="mnesio-request-id-publish", weak=False)
    task_prerun.connect(_task_prerun, dispatch_uid="mnesio-request-id-prerun", weak=False)
    task_postrun.connect(_task_postrun, dispatch_uid="mnesio-request-id-postrun", weak=False)

