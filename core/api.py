"""Request-body parsing: every write endpoint reads its JSON object body and validates it here, once."""
from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.request import Request

from core.errors import MnesioError


def request_body(request: Request) -> dict[str, Any]:
    """Return the parsed JSON object body, or raise a 400 naming `body` (malformed, nested too deep, not an object)."""
    try:
        data = request.data
    except ParseError as exc:
        raise MnesioError(f"`body` has to be a JSON object but is not valid JSON: {exc.detail}", extra={"field": "body"}) from None
    except RecursionError:
        # json's parser recurses once per nesting level: ~1,000 levels exhaust the stack (a hostile body)
        raise MnesioError(
            "`body` is nested too deeply to parse; send a JSON object of plain fields", extra={"field": "body"}
        ) from None
    if not isinstance(data, dict):
        raise MnesioError(f"`body` has to be a JSON object but got {type(data).__name__}", extra={"field": "body"})
    return data


def validated(serializer_class: type, request: Request) -> dict[str, Any]:
    """Validate the JSON object body with ``serializer_class`` (unknown fields, types, bounds) and return it."""
    serializer = serializer_class(data=request_body(request))
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)
