"""The items of an append (one memory or a batch): each validated, every bad one named by its path, repeated
idempotency keys linked within the batch and checked against the rows the scope already holds."""
from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field

from core.errors import Conflict, MnesioError
from memories.models import Memory, Scope
from memories.selectors import memories_open

from .validation import (
    MAX_BATCH_ITEMS,
    MAX_IDEMPOTENCY_KEY_CHARS,
    content_validate,
    identifier_validate,
    metadata_encode,
    metadata_validate,
    subject_id_validate,
)


@dataclass
class AppendItem:
    """One validated item of a batch."""

    index: int
    content: str
    data: bytes
    subject: str | None
    idempotency_key: str | None
    metadata: bytes | None
    first: int | None = None  # index of an earlier item with the same idempotency key


@dataclass
class BatchError(Exception):
    """Bad items of a batch, collected so one error names them all."""

    errors: list[tuple[int, MnesioError]] = field(default_factory=list)


def item_path(index: int | None, field_name: str) -> str:
    return field_name if index is None else f"items[{index}].{field_name}"


def batch_failure(errors: list[tuple[int, MnesioError]], *, single: bool) -> MnesioError:
    """One error for the whole batch: the single append's own error, or every item's named by path."""
    if single:
        return errors[0][1]
    listed = []
    for index, exc in errors:
        name = exc.extra.get("field", "item")
        listed.append({"index": index, "field": item_path(index, name), "message": exc.message,
                       "status": exc.status_code})
    status = max(exc.status_code for _, exc in errors)  # a conflict (409) outranks a bad field (400)
    message = f"{len(errors)} of the batch's items were refused and nothing was written: " + "; ".join(
        f"`{e['field']}`: {e['message']}" for e in listed[:20]
    ) + ("; ..." if len(listed) > 20 else "")
    return MnesioError(message, extra={"field": listed[0]["field"], "errors": listed}, status_code=status)


ITEM_FIELDS = frozenset({"content", "subject", "idempotency_key", "metadata"})


def items_validate(raw_items: object, *, single: bool) -> list[AppendItem]:
    """Validate every item (collecting every bad one) and link repeated idempotency keys within the batch."""
    if not isinstance(raw_items, (list, tuple)):
        raise MnesioError(f"`items` has to be a list but got {type(raw_items).__name__}", extra={"field": "items"})
    if not 1 <= len(raw_items) <= MAX_BATCH_ITEMS:
        raise MnesioError(
            f"`items` has to hold 1 to {MAX_BATCH_ITEMS} memories but got {len(raw_items)}", extra={"field": "items"}
        )
    items: list[AppendItem] = []
    errors: list[tuple[int, MnesioError]] = []
    seen: dict[str, AppendItem] = {}
    for index, raw in enumerate(raw_items):
        if not isinstance(raw, Mapping):
            errors.append((index, MnesioError(f"an item has to be an object but got {type(raw).__name__}",
                                              extra={"field": "item"})))
            continue
        unknown = sorted(str(key) for key in raw if key not in ITEM_FIELDS)
        if unknown:
            errors.append((index, MnesioError(f"unknown field; the accepted fields are {sorted(ITEM_FIELDS)}",
                                              extra={"field": unknown[0]})))
            continue
        try:
            data = content_validate(raw.get("content"))
            subject = raw.get("subject")
            subject = subject_id_validate(subject) if subject is not None else None
            key = raw.get("idempotency_key")
            if key is not None:
                key = identifier_validate(key, field="idempotency_key", max_chars=MAX_IDEMPOTENCY_KEY_CHARS)
            metadata = metadata_validate(raw.get("metadata"))
        except MnesioError as exc:
            errors.append((index, exc))
            continue
        item = AppendItem(index, raw["content"], data, subject, key, metadata)
        if key is not None:
            earlier = seen.get(key)
            if earlier is None:
                seen[key] = item
            elif (earlier.subject, earlier.content, earlier.metadata) != (subject, item.content, metadata):
                errors.append((index, Conflict(
                    f"`idempotency_key` '{key}' is used by item {earlier.index} of this batch with other content, "
                    "subject or metadata", extra={"field": "idempotency_key"})))
                continue
            else:
                item.first = earlier.index
        items.append(item)
    if errors:
        raise batch_failure(errors, single=single)
    return items


def existing_check(scope: Scope, items: list[AppendItem]) -> dict[str, Memory]:
    """Rows already in the scope for the batch's idempotency keys (opened: a repeat is compared with its original)."""
    keys = sorted({item.idempotency_key for item in items if item.idempotency_key is not None})
    if not keys:
        return {}
    rows = list(
        Memory.objects.filter(scope=scope, idempotency_key__in=keys).select_related("scope__key", "subject", "own_key")
    )
    return {row.idempotency_key: row for row in rows}


def repeat_errors(items: list[AppendItem], existing: dict[str, Memory]) -> list[tuple[int, MnesioError]]:
    """409s for items whose idempotency key was used in this scope for another subject, content or metadata."""
    if not existing:
        return []
    opened = {row.idempotency_key: o for row, o in zip(existing.values(), memories_open(existing.values()), strict=True)}
    errors = []
    for item in items:
        row = existing.get(item.idempotency_key) if item.idempotency_key is not None else None
        if row is None:
            continue
        existing_subject = unicodedata.normalize("NFC", row.subject.external_id) if row.subject_id else None
        if existing_subject != item.subject:
            errors.append((item.index, Conflict(
                f"`idempotency_key` was already used in this scope for memory seq={row.seq} with another subject",
                extra={"field": "idempotency_key", "seq": row.seq})))
            continue
        memory = opened[item.idempotency_key]
        same_metadata = (metadata_encode(memory.metadata) if memory.metadata else None) == item.metadata
        if not memory.erased and (memory.text != item.content or not same_metadata):
            errors.append((item.index, Conflict(
                f"`idempotency_key` was already used in this scope for memory seq={row.seq} with other content"
                + ("" if same_metadata else " or metadata"),
                extra={"field": "idempotency_key", "seq": row.seq})))
    return errors
