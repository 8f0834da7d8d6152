"""The JSON body parser of every API view (/api/ and /v1/): DRF's, plus the two refusals it lacks.

- A body nested deeper than Python's parser recurses (``[[[[...`` 100,000 levels) raises RecursionError inside
  ``json``; here it is a ParseError (400 naming `body`) on every view, not only on those that catch it.
- JSON may spell a lone UTF-16 surrogate (``"\\ud800"``), which Python decodes into a ``str`` that no UTF-8
  encoder accepts: PostgreSQL's driver, the sealing of a question for a gpu worker and the key derivation all
  raised UnicodeEncodeError (a 500) wherever such a string reached them. No field of this API takes one, so the
  whole parsed body is checked once, here, and the 400 names where the string is (``items[1].subject``).
"""
from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def lone_surrogate_path(data: Any) -> str | None:
    """The path (``items[1].subject``) of the first string (a key or a value) in ``data`` with a lone surrogate."""
    stack: list[tuple[str, Any]] = [("", data)]  # iterative: the body may be ~1,000 levels deep
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _has_surrogate(value):
                return path or "body"
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                name = f"{path}.{key}" if path else str(key)
                if _has_surrogate(str(key)):
                    return path or "body"
                stack.append((name, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


class StrictJSONParser(JSONParser):
    """DRF's JSONParser; too deep a body is a ParseError and a lone surrogate a 400 naming its field."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("the body is nested too deeply to parse; send a JSON object of plain fields") from None
        path = lone_surrogate_path(data)
        if path is not None:
            # imported here: core.errors imports DRF's views, which import this parser from the settings
            from core.errors import MnesioError

            raise MnesioError(
                f"`{path}` has to be valid Unicode text but holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
                "escape)",
                extra={"field": path},
            )
        return data
