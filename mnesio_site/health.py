"""Health endpoints for load balancers and orchestrators: ``/healthz`` (liveness) and ``/readyz`` (readiness).

``/healthz`` answers 200 as long as the process does, touching nothing else. ``/readyz`` answers 200 when
every dependency this process needs answers (database, broker, blob storage, the model: loaded in the
background on the first probe, ``loading`` until then), else 503; anonymous callers get the status alone,
a staff token also each check's status, duration and error class, never an error message. A middleware
first in MIDDLEWARE answers them, before the https redirect, the host check and authentication.

Design (each check, why a middleware, why not django-health-check): docs/design/health.md.
"""
from __future__ import annotations

import errno as errno_module
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

log = logging.getLogger("mnesio")

HEALTH_PATHS = ("/healthz", "/readyz")
# A probe must answer within a load balancer's timeout (typically 5 s) even when a dependency hangs.
BROKER_TIMEOUT_S = 2.0

_model_lock = threading.Lock()
_model_loading: dict[str, threading.Thread] = {}
_model_errors: dict[str, str] = {}


def _failure(exc: BaseException) -> dict[str, Any]:
    """What a failed check reports: the class and errno only (see the module docstring), logged in full."""
    code = getattr(exc, "errno", None)
    if code is None and exc.__cause__ is not None:  # an application error raised from the OSError
        code = getattr(exc.__cause__, "errno", None)
    out: dict[str, Any] = {"status": "unavailable", "error": type(exc).__name__}
    if isinstance(code, int):
        out["errno"] = errno_module.errorcode.get(code, str(code))
    return out


def check_database() -> dict[str, Any]:
    """``SELECT 1`` on the default database."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"status": "ok"}


def check_broker() -> dict[str, Any]:
    """Connect to the Celery broker (skipped when tasks run in-process)."""
    from mnesio_site.celery import app

    if app.conf.task_always_eager or not app.conf.broker_url:
        return {"status": "skipped", "detail": "no broker: tasks run in-process"}
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT_S)
        # a TCP connection is not an answer: have the broker do something (Redis: PING)
        client = getattr(conn.default_channel, "client", None)
        if client is not None and hasattr(client, "ping"):
            client.ping()
    return {"status": "ok"}


_storage_lock = threading.Lock()
_storage_cached: tuple[float, dict[str, Any]] | None = None  # (monotonic time of the check, its result)


def readiness_cache_clear() -> None:
    """Forget the cached storage check (tests; a process that changed its storage settings)."""
    global _storage_cached
    with _storage_lock:
        _storage_cached = None


def check_blob_storage_cached() -> dict[str, Any]:
    """``check_blob_storage``'s result, at most MNESIO_READYZ_STORAGE_CACHE_S old (a failure is cached alike)."""
    global _storage_cached
    max_age = settings.MNESIO_READYZ_STORAGE_CACHE_S
    with _storage_lock:  # one probe object at a time, and concurrent probes share it
        now = time.monotonic()
        if _storage_cached is not None and now - _storage_cached[0] < max_age:
            return {**_storage_cached[1], "cached": True}
        try:
            result = check_blob_storage()
        except Exception as exc:
            log.warning("readyz: blob_storage check failed: %s: %s", type(exc).__name__, exc)
            result = _failure(exc)
        _storage_cached = (now, result)
        return dict(result)


def check_blob_storage() -> dict[str, Any]:
    """Write, read back and delete a probe object through the cartridge storage backend."""
    from django.core.files.base import ContentFile

    from cartridges.storage import blob_storage

    storage = blob_storage()
    name = f"readyz/probe-{uuid.uuid4().hex}"
    payload = b"mnesio readiness probe"
    saved = storage.save(name, ContentFile(payload))
    try:
        with storage.open(saved, "rb") as fh:
            if fh.read() != payload:
                return {"status": "unavailable", "error": "ProbeMismatch"}
    finally:
        storage.delete(saved)
    return {"status": "ok"}


def _model_load(config: Any, key: str) -> None:
    from cartridges import engine

    try:
        engine.backend_for(config)
        _model_errors.pop(key, None)
    except Exception as exc:  # reported by the next probe, which also retries
        log.warning("readyz: loading the model %s failed: %s", key, type(exc).__name__)
        _model_errors[key] = type(exc).__name__
    finally:
        from django.db import connection

        connection.close()  # this thread's own connection, if the load opened one
        with _model_lock:
            _model_loading.pop(key, None)


def check_model() -> dict[str, Any]:
    """Whether the active configuration's model is loaded in this process (starting its load when not)."""
    if not settings.MNESIO_READYZ_MODEL:
        return {"status": "skipped", "detail": "this process does not answer (MNESIO_READYZ_MODEL=false)"}
    from cartridges.conf import web_loads_model

    if not web_loads_model():  # a model-free web tier: loading one here is what it exists not to do
        return {"status": "skipped", "detail": "gpu workers answer this process's asks (MNESIO_WEB_LOADS_MODEL=false)"}
    from cartridges import engine
    from cartridges.selectors import active_configuration

    config = engine.kv_config(active_configuration())
    key = config.key
    if key in engine.cache_info()["backends_loaded"]:
        return {"status": "ok", "model": key}
    with _model_lock:
        failed = _model_errors.pop(key, None)
        if key not in _model_loading:
            thread = threading.Thread(target=_model_load, args=(config, key), name=f"readyz-load-{key}", daemon=True)
            _model_loading[key] = thread
            thread.start()
    if failed:
        return {"status": "unavailable", "model": key, "error": failed, "detail": "loading again"}
    return {"status": "loading", "model": key}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "broker": check_broker,
    "blob_storage": check_blob_storage_cached,
    "model": check_model,
}


def readiness() -> tuple[bool, dict[str, Any]]:
    """Run every check; (all ok, the per-check results)."""
    results: dict[str, Any] = {}
    for name, check in CHECKS.items():
        started = time.perf_counter()
        try:
            result = check()
        except Exception as exc:
            log.warning("readyz: %s check failed: %s: %s", name, type(exc).__name__, exc)
            result = _failure(exc)
        result["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
        results[name] = result
    ok = all(r["status"] in ("ok", "skipped") for r in results.values())
    return ok, results


def _shows_details(request: HttpRequest) -> bool:
    """Whether the request carries a staff user's API token (the checks' details are for operators)."""
    if not request.META.get("HTTP_AUTHORIZATION"):
        return False
    from mnesio_site.authentication import TokenAuthentication

    try:
        authenticated = TokenAuthentication().authenticate(request)
    except Exception:  # a wrong token, or a database that cannot check it: the anonymous answer
        return False
    user = authenticated[0] if authenticated else None
    return bool(user is not None and user.is_active and user.is_staff)


def _answer(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return JsonResponse({"code": "method_not_allowed", "message": f"`{request.path}` answers GET and HEAD only",
                             "extra": {}}, status=405, headers={"Allow": "GET, HEAD"})
    if request.path == "/healthz":
        response = JsonResponse({"status": "ok"})
    else:
        ok, checks = readiness()
        body: dict[str, Any] = {"status": "ok" if ok else "unavailable"}
        if _shows_details(request):
            body["checks"] = checks
        response = JsonResponse(body, status=200 if ok else 503)
    response["Cache-Control"] = "no-store"
    # each failed check is logged once above as a warning; not again as an ERROR per probe by django.request
    response._has_been_logged = True
    return response


class HealthMiddleware:
    """Answer ``/healthz`` and ``/readyz`` before any other middleware (see the module docstring for why)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in HEALTH_PATHS:
            return _answer(request)
        return self.get_response(request)
