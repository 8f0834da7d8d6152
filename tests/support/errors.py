"""The house error shape ({"code", "message", "extra"}), asserted."""
from __future__ import annotations

from typing import Any


def assert_error(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """Assert an error response in the house shape ({"code", "message", "extra"}) with ``status``, naming ``field``."""
    from core.errors import ERROR_CODES

    assert response.status_code == status, (response.status_code, response.content[:500])
    body = response.json()
    assert set(body) == {"code", "message", "extra"}, body
    assert body["code"] in ERROR_CODES, body
    if field is not None:
        named = f"`{field}`" in body["message"] or body["extra"].get("field") == field or field in body["extra"].get(
            "fields", {}
        )
        assert named, body
        assert field in body["message"], body
    return body
