"""Validation of what a caller hands the log: memory content, subject ids, idempotency keys."""
from __future__ import annotations

import unicodedata

from django.conf import settings

from core.errors import MnesioError

MAX_SUBJECT_CHARS = 200
MAX_IDEMPOTENCY_KEY_CHARS = 200
MAX_REASON_CHARS = 2000


def _max_memory_bytes() -> int:
    return settings.MNESIO_MAX_MEMORY_BYTES


def content_validate(content: object) -> bytes:
    """Return the UTF-8 bytes of ``content`` or raise naming `content` (empty, not text, over the limit)."""
    if not isinstance(content, str):
        raise MnesioError(f"`content` has to be a string but got {type(content).__name__}", extra={"field": "content"})
    if not content.strip():
        raise MnesioError("`content` has to be non-empty text but got an empty string", extra={"field": "content"})
    if "\x00" in content:
        raise MnesioError("`content` must not contain NUL characters", extra={"field": "content"})
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise MnesioError("`content` has to be valid Unicode text (it has lone surrogates)", extra={"field": "content"}) from None
    limit = _max_memory_bytes()
    if len(data) > limit:
        raise MnesioError(
            f"`content` has to be at most {limit} bytes of UTF-8 (MNESIO_MAX_MEMORY_BYTES) but got {len(data)}",
            extra={"field": "content", "limit": limit, "size": len(data)},
        )
    return data


def _token_validate(value: object, *, field: str, max_chars: int) -> str:
    """Validate an identifier-like string (subject id, idempotency key): non-empty, printable, bounded."""
    if not isinstance(value, str):
        raise MnesioError(f"`{field}` has to be a string but got {type(value).__name__}", extra={"field": field})
    if not value.strip():
        raise MnesioError(f"`{field}` has to be non-empty but got {value!r}", extra={"field": field})
    if len(value) > max_chars:
        raise MnesioError(
            f"`{field}` has to be at most {max_chars} characters but got {len(value)}", extra={"field": field}
        )
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise MnesioError(f"`{field}` must not contain control characters", extra={"field": field})
    return value


def subject_id_validate(subject: object) -> str:
    """Return a valid subject external id in Unicode NFC, or raise naming `subject`.

    NFC at every entry point: "josé" composed and decomposed are one person, so an erasure filed with
    either spelling covers memories filed with the other (memories.selectors.subject_id_variants also
    matches rows stored before this normalization).
    """
    value = _token_validate(subject, field="subject", max_chars=MAX_SUBJECT_CHARS)
    # invisible characters (zero-width space and joiners, bidi overrides, line/paragraph separators) would make
    # "bob" and "bob\u200b" two subjects that look the same, and an erasure of one would miss the other
    invisible = sorted({f"U+{ord(ch):04X}" for ch in value if unicodedata.category(ch) in ("Cf", "Zl", "Zp")})
    if invisible:
        raise MnesioError(
            f"`subject` must not contain invisible format characters but has {invisible}", extra={"field": "subject"}
        )
    return unicodedata.normalize("NFC", value)

