"""Validation of what a caller hands the log: memory content, subject ids, idempotency keys, metadata."""
from __future__ import annotations

import json
import math
import unicodedata
from typing import Any

from django.conf import settings

from core.errors import MnesioError

# in settings, which derives the request body limit from them (DATA_UPLOAD_MAX_MEMORY_SIZE)
MAX_SUBJECT_CHARS = settings.MNESIO_MAX_SUBJECT_CHARS
MAX_IDEMPOTENCY_KEY_CHARS = settings.MNESIO_MAX_IDEMPOTENCY_KEY_CHARS
MAX_REASON_CHARS = 2000
MAX_BATCH_ITEMS = settings.MNESIO_MAX_BATCH_ITEMS
MAX_METADATA_DEPTH = 4  # {"a": {"b": [..]}} is depth 3: enough for tags and small records, not documents
MAX_METADATA_KEY_CHARS = 100


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


def identifier_validate(value: object, *, field: str, max_chars: int) -> str:
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
    value = identifier_validate(subject, field="subject", max_chars=MAX_SUBJECT_CHARS)
    # invisible characters (zero-width space and joiners, bidi overrides, line/paragraph separators) would make
    # "bob" and "bob\u200b" two subjects that look the same, and an erasure of one would miss the other
    invisible = sorted({f"U+{ord(ch):04X}" for ch in value if unicodedata.category(ch) in ("Cf", "Zl", "Zp")})
    if invisible:
        raise MnesioError(
            f"`subject` must not contain invisible format characters but has {invisible}", extra={"field": "subject"}
        )
    return unicodedata.normalize("NFC", value)



def _max_metadata_bytes() -> int:
    return settings.MNESIO_MAX_METADATA_BYTES


def _metadata_check(value: Any, *, path: str, depth: int) -> None:
    """Raise naming ``path`` when ``value`` is not plain JSON within the depth limit."""
    if isinstance(value, dict):
        if depth >= MAX_METADATA_DEPTH:
            raise MnesioError(
                f"`{path}` nests deeper than {MAX_METADATA_DEPTH} levels of objects and lists", extra={"field": path}
            )
        for key, item in value.items():
            if not isinstance(key, str) or not key or len(key) > MAX_METADATA_KEY_CHARS:
                raise MnesioError(
                    f"`{path}` keys have to be non-empty strings of at most {MAX_METADATA_KEY_CHARS} characters "
                    f"but got {str(key)[:60]!r}",
                    extra={"field": path},
                )
            if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in key):
                raise MnesioError(f"`{path}` keys must not contain control characters", extra={"field": path})
            _metadata_check(item, path=f"{path}.{key}", depth=depth + 1)
    elif isinstance(value, list):
        if depth >= MAX_METADATA_DEPTH:
            raise MnesioError(
                f"`{path}` nests deeper than {MAX_METADATA_DEPTH} levels of objects and lists", extra={"field": path}
            )
        for i, item in enumerate(value):
            _metadata_check(item, path=f"{path}[{i}]", depth=depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise MnesioError(f"`{path}` has to be a finite number but got {value}", extra={"field": path})
    elif isinstance(value, str):
        if any(unicodedata.category(ch) == "Cs" for ch in value) or "\x00" in value:
            raise MnesioError(f"`{path}` must not contain NUL characters or lone surrogates", extra={"field": path})
    elif value is not None and not isinstance(value, (bool, int)):
        raise MnesioError(
            f"`{path}` has to be a JSON value (object, list, string, number, true/false, null) but got "
            f"{type(value).__name__}",
            extra={"field": path},
        )


def metadata_validate(metadata: object, *, field: str = "metadata") -> bytes | None:
    """Return the canonical JSON bytes of ``metadata`` (None when absent or empty), or raise naming the field.

    A JSON object of at most MNESIO_MAX_METADATA_BYTES (canonical form: sorted keys, no spaces), nested at most
    MAX_METADATA_DEPTH levels; the error names the path of the offending value (``metadata.tags[2]``).
    """
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise MnesioError(
            f"`{field}` has to be a JSON object but got {type(metadata).__name__}", extra={"field": field}
        )
    if not metadata:
        return None
    _metadata_check(metadata, path=field, depth=0)
    data = metadata_encode(metadata)
    limit = _max_metadata_bytes()
    if len(data) > limit:
        raise MnesioError(
            f"`{field}` has to be at most {limit} bytes of JSON (MNESIO_MAX_METADATA_BYTES) but got {len(data)}",
            extra={"field": field, "limit": limit, "size": len(data)},
        )
    return data


def metadata_encode(metadata: dict) -> bytes:
    """The canonical JSON of a metadata object (what is sealed, what the size limit counts)."""
    return json.dumps(metadata, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
