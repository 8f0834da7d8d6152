"""DRF and the OpenAPI schema: authentication, parsers, errors and pagination of every API view, and what
drf-spectacular documents (the /api/v1/ routes only, assets served from this server)."""
from __future__ import annotations

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "mnesio_site.authentication.TokenAuthentication",  # knox: tokens stored hashed
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies refuse lone surrogates and too deep nesting with a 400 (core/parsers.py); forms as DRF's default
    "DEFAULT_PARSER_CLASSES": [
        "core.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "core.errors.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "core.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "mnesio API",
    "DESCRIPTION": "Long-term memory for AI agents: an append-only log compiled into KV cartridges. "
    "The API is versioned under /api/v1/; the unversioned /api/... paths are a deprecated alias of the same "
    "endpoints (their responses carry `Deprecation: true` and a `Link` to the /api/v1/ successor).",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and the docs page list every route and field: for logged-in users only (token or session).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # The schema documents /api/v1/; /api/... is the same API under a deprecated alias (mnesio_site.versioning).
    "PREPROCESSING_HOOKS": ["mnesio_site.versioning.v1_endpoints_only"],
    # The docs pages load their JavaScript and CSS from this server (drf-spectacular-sidecar), never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # "layout" is a scope's setting (three values) and, in an answer, what answered (two): one name each
    "ENUM_NAME_OVERRIDES": {"ScopeLayoutEnum": ["prefix", "routed", "auto"], "AnswerLayoutEnum": ["prefix", "routed"]},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",  # the default hook, kept
        "mnesio_site.versioning.unversioned_operation_ids",
        # the Error component (a `code` enum from core.errors.ERROR_CODES) and the error responses of every operation
        "core.schema.error_responses",
    ],
}
