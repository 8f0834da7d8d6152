"""The one error the client raises for an answer of the API that is not a success."""
from __future__ import annotations

from typing import Any

import httpx


class MnesioError(Exception):
    """An error answered by the API: its stable ``code`` (switch on it), ``message``, ``extra`` and HTTP status.

    The codes are the API's (docs/api.md, "Errors": ``invalid_input``, ``not_found``, ``authentication_failed``, ...).
    An error met in the middle of a streamed answer is raised the same way, with the status it would have had.
    """

    def __init__(self, *, code: str, message: str, extra: dict[str, Any] | None = None, status_code: int,
                 retry_after_s: float | None = None):
        super().__init__(f"{status_code} {code}: {message}")
        self.code = code
        self.message = message
        self.extra: dict[str, Any] = extra or {}
        self.status_code = status_code
        self.retry_after_s = retry_after_s  # the Retry-After header of a 429/503/504, when the server sent one

    @classmethod
    def from_body(cls, body: Any, *, status_code: int, retry_after_s: float | None = None) -> MnesioError:
        """The error of a parsed ``{code, message, extra}`` body (anything else keeps its text as the message)."""
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            extra = body.get("extra") if isinstance(body.get("extra"), dict) else {}
            code = body.get("code") if isinstance(body.get("code"), str) else "error"
            return cls(code=code, message=body["message"], extra=extra, status_code=status_code,
                       retry_after_s=retry_after_s)
        return cls(code="error", message=str(body)[:500], status_code=status_code, retry_after_s=retry_after_s)

    @classmethod
    def from_response(cls, response: httpx.Response) -> MnesioError:
        """The error of a non-2xx response (its body read already)."""
        try:
            body: Any = response.json()
        except ValueError:  # not JSON: a proxy's HTML page, say
            body = response.text or response.reason_phrase
        return cls.from_body(body, status_code=response.status_code, retry_after_s=_retry_after(response))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: the API sends seconds, a proxy might not
        return None
