"""The OpenAPI schema's error responses: one ``Error`` component whose ``code`` enum is ``core.errors.ERROR_CODES``.

A drf-spectacular postprocessing hook rather than a decorator per view: every operation of every app (and any
added later) gets the same error responses without its view naming them, and the enum is built from the one
registry the exception handler uses, so schema and behaviour cannot drift apart. For each operation it:

- gives every declared 4xx/5xx response (views declare them as a bare description) the ``Error`` body;
- adds the responses every authenticated operation can return whatever its view declares: 400 (a body or
  query that does not validate), 401 (no or a bad token), 403, 404 (an ungranted scope answers as a missing
  one), 405, 406, 415, 429 and 503 (database or master key unavailable), and for writes 409 and 422, so a client
  (and the schemathesis run, tests/reliability/test_fuzz_api.py) can check every error body against the schema.
"""
from __future__ import annotations

from typing import Any

from core.errors import ERROR_CODES

ERROR_REF = {"$ref": "#/components/schemas/Error"}
# What any operation of this API may answer besides what its view declares (see the module docstring).
COMMON_ERRORS = {
    "400": "Invalid input: `code` says which kind, `message` names the field and what was wrong",
    "401": "Not authenticated: send `Authorization: Bearer <token>` (or `Token <token>`)",
    "403": "Permission denied",
    "404": "Not found (a scope not granted to you answers the same)",
    "405": "Method not allowed",
    "406": "Not acceptable (the API answers JSON)",
    "415": "Unsupported media type (send JSON)",
    "429": "Overloaded: retry after `Retry-After` seconds",
    "503": "A dependency (database, blob storage, master key) is unavailable: retry later",
}
# What any write may also answer: a conflict with the stored state (a reused idempotency key with other content, an
# erased subject, a duplicate name, a failed gate) and a refusal of what does not fit the model's window.
WRITE_ERRORS = {
    "409": "Conflict with the stored state: `code` says which",
    "422": "Does not fit the model's context window (`context_too_long`)",
}


def error_component() -> dict[str, Any]:
    """The ``Error`` schema: ``{"code", "message", "extra"}``, ``code`` an enum documented value by value."""
    lines = "\n".join(f"- `{code}` ({status}): {meaning}" for code, (status, meaning) in ERROR_CODES.items())
    return {
        "type": "object",
        "description": "Every error body. Switch on `code`; `message` is for people; `extra` holds details "
        "(`field`/`fields` naming the input, and the older `kind`/`code` keys kept for compatibility).",
        "properties": {
            "code": {"type": "string", "enum": list(ERROR_CODES), "description": f"The stable error code:\n\n{lines}"},
            "message": {"type": "string", "description": "What was wrong, naming the field, the allowed values and "
                        "what was received"},
            "extra": {"type": "object", "additionalProperties": True},
        },
        "required": ["code", "message", "extra"],
    }


def error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOKS entry: add the Error component and the error responses (see above)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = error_component()
    content = {"application/json": {"schema": ERROR_REF}}
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in ("get", "put", "patch", "post", "delete") or not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            # an operation that also answers another format (/api/kv/metrics: Prometheus text) answers its errors in
            # that format too: a text line, documented as a string
            other_types = {media: {"schema": {"type": "string"}}
                           for ok_status, ok in responses.items() if str(ok_status).startswith("2")
                           for media in (ok.get("content") or {}) if "json" not in media}
            error_content = {**content, **other_types}
            for status_code, response in responses.items():
                if str(status_code)[:1] in ("4", "5") and not response.get("content"):
                    response["content"] = error_content
            common = {**COMMON_ERRORS, **(WRITE_ERRORS if method != "get" else {})}
            for status_code, description in common.items():
                responses.setdefault(status_code, {"description": description, "content": error_content})
    return result
