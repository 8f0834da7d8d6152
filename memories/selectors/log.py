"""Reads of the log: the head, a scope's memories opened (decrypted) as of a head, filtered and one by one."""
from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Max, QuerySet
from django.views.decorators.debug import sensitive_variables

from core.errors import MnesioError, NotFound
from memories import crypto
from memories.models import (
    Memory,
    MemoryKey,
    Scope,
    Subject,
)

from .subjects import subject_id_variants


class MemoryIntegrityError(MnesioError):
    """A memory row failed authentication: its ciphertext was altered or copied from another row."""

    status_code = 500


@dataclass(frozen=True)
class OpenedMemory:
    """A memory as a reader sees it: the text and metadata, or ``erased=True``, no text and ``{}`` once it is
    erased (its subject's key, its own key or its deleted scope's key shredded)."""

    seq: int
    subject: str | None  # the subject's external id
    text: str | None
    erased: bool
    created_at: dt.datetime
    subject_id: int | None = None  # the subject row's pk (subjects are per scope; compile locks these rows)
    metadata: dict = field(default_factory=dict)  # the optional JSON object sealed with the memory


# A seq is a PostgreSQL bigint (at most 2**63 - 1, 19 digits).
MAX_SEQ_DIGITS = 19


def log_head() -> int:
    """Return the seq of the newest committed memory (0 for an empty log)."""
    return Memory.objects.aggregate(head=Max("seq"))["head"] or 0


def scope_head(*, scope: Scope) -> int:
    """Return the seq of the scope's newest memory (0 for none): the head a scope's client may see."""
    return Memory.objects.filter(scope=scope).aggregate(head=Max("seq"))["head"] or 0


def shown(value: object) -> str:
    """The received value for an error message, cut short (a query or path value can be megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def as_of_validate(as_of: object, *, scope: Scope | None = None) -> int:
    """Return ``as_of`` as a head no later than the current one (the scope's, given one), or raise naming `as_of`.

    With ``scope`` the bound and the message use the scope's head, never the global one: a client
    learns nothing of other scopes' activity from an error.
    """
    if isinstance(as_of, int) and not isinstance(as_of, bool):
        value = as_of
    elif isinstance(as_of, str) and re.fullmatch(r"-?[0-9]+", as_of.strip()):
        digits = as_of.strip().lstrip("-").lstrip("0")
        if len(digits) > MAX_SEQ_DIGITS:
            # past any seq (a bigint); and int() refuses strings over 4,300 digits (ValueError, not a 400)
            raise MnesioError(
                f"`as_of` has to be an integer log head of at most {MAX_SEQ_DIGITS} digits but got {len(digits)} digits",
                extra={"field": "as_of"},
            )
        value = int(as_of)
    else:
        raise MnesioError(f"`as_of` has to be an integer log head but got {shown(as_of)}", extra={"field": "as_of"})
    if value < 0:
        raise MnesioError(f"`as_of` has to be >= 0 but got {value}", extra={"field": "as_of"})
    head = log_head() if scope is None else scope_head(scope=scope)
    if value > head:
        which = "the current log head" if scope is None else f"scope '{scope.name}''s head"
        raise MnesioError(
            f"`as_of` has to be at most {which} {head} but got {value}",
            extra={"field": "as_of", "head": head},
        )
    return value


def scope_memories(*, scope: Scope, as_of: int | None = None) -> QuerySet[Memory]:
    """Return the scope's memory rows with seq <= ``as_of`` (all when None), ordered by seq."""
    rows = Memory.objects.filter(scope=scope).select_related("scope__key", "subject", "own_key").order_by("seq")
    if as_of is not None:
        rows = rows.filter(seq__lte=as_of)
    return rows


def _own_key(memory: Memory) -> MemoryKey | None:
    """The memory's own key row (None for a memory appended before memories had one)."""
    try:
        return memory.own_key
    except MemoryKey.DoesNotExist:
        return None


@sensitive_variables()
def memories_open(memories: Iterable[Memory]) -> list[OpenedMemory]:
    """Decrypt rows (fetched with ``scope__key``, ``subject`` and ``own_key`` selected); each parent key is
    unwrapped once.

    A memory is erased when its subject is shredded, its own key is shredded (forgotten), or it has no
    subject and its scope's key is shredded (a deleted scope). A memory with its own key opens with it;
    one appended before memories had own keys opens with its parent's key, until a backfill gives it one.
    """
    keys: dict[tuple[str, int], bytes] = {}
    opened = []
    for memory in memories:
        subject: Subject | None = memory.subject
        own = _own_key(memory)
        scope_key = memory.scope.key if subject is None else None
        if (
            (subject is not None and subject.is_shredded)
            or (own is not None and own.is_shredded)
            or (scope_key is not None and scope_key.is_shredded)
        ):
            opened.append(OpenedMemory(
                memory.seq, subject.external_id if subject else None, None, True, memory.created_at,
                subject.pk if subject else None,
            ))
            continue
        if subject is not None:
            cache_key = ("subject", subject.pk)
            if cache_key not in keys:
                keys[cache_key] = crypto.unwrap(
                    subject.wrapped_key,
                    wrapped_by=subject.wrapped_by,
                    aad=crypto.subject_key_aad(subject.external_id, subject.scope_id),
                )
        else:
            cache_key = ("scope", memory.scope_id)
            if cache_key not in keys:
                keys[cache_key] = crypto.unwrap(
                    scope_key.wrapped_key, wrapped_by=scope_key.wrapped_by, aad=crypto.scope_key_aad(memory.scope_id)
                )
        where = {"seq": memory.seq, "scope_id": memory.scope_id, "subject_id": memory.subject_id}
        metadata: dict = {}
        try:
            if own is None:
                text = crypto.unseal(keys[cache_key], memory.nonce, memory.ciphertext, aad=crypto.memory_aad(**where)).decode()
            else:
                memory_key = crypto.open_box(keys[cache_key], own.wrapped_key, aad=crypto.memory_key_aad(**where))
                if own.resealed is not None:
                    text = crypto.open_box(memory_key, own.resealed, aad=crypto.memory_resealed_aad(**where)).decode()
                else:
                    text = crypto.unseal(memory_key, memory.nonce, memory.ciphertext, aad=crypto.memory_aad(**where)).decode()
                if memory.metadata_box is not None:
                    metadata = json.loads(
                        crypto.open_box(memory_key, memory.metadata_box, aad=crypto.memory_metadata_aad(**where))
                    )
        except crypto.InvalidTag:
            raise MemoryIntegrityError(
                f"memory seq={memory.seq} failed authentication: its ciphertext does not belong to this row",
                extra={"seq": memory.seq},
            ) from None
        opened.append(
            OpenedMemory(
                memory.seq, subject.external_id if subject else None, text, False, memory.created_at, memory.subject_id,
                metadata,
            )
        )
    return opened


@sensitive_variables()
def memory_own_keys(memories: Iterable[Memory]) -> dict[int, bytes]:
    """The own data key of each memory (rows fetched as for memories_open) by seq; erased memories and those
    appended before memories had own keys are left out.

    For derived copies sealed under a memory's key (cartridges' routed chunks): forgetting the memory, erasing
    its subject or deleting its scope makes them unreadable with it.
    """
    parents: dict[tuple[str, int], bytes] = {}
    found: dict[int, bytes] = {}
    for memory in memories:
        subject: Subject | None = memory.subject
        own = _own_key(memory)
        scope_key = memory.scope.key if subject is None else None
        if own is None or own.is_shredded or (subject is not None and subject.is_shredded) or (
            scope_key is not None and scope_key.is_shredded
        ):
            continue
        if subject is not None:
            cache_key = ("subject", subject.pk)
            if cache_key not in parents:
                parents[cache_key] = crypto.unwrap(
                    subject.wrapped_key, wrapped_by=subject.wrapped_by,
                    aad=crypto.subject_key_aad(subject.external_id, subject.scope_id),
                )
        else:
            cache_key = ("scope", memory.scope_id)
            if cache_key not in parents:
                parents[cache_key] = crypto.unwrap(
                    scope_key.wrapped_key, wrapped_by=scope_key.wrapped_by, aad=crypto.scope_key_aad(memory.scope_id)
                )
        where = {"seq": memory.seq, "scope_id": memory.scope_id, "subject_id": memory.subject_id}
        found[memory.seq] = crypto.open_box(parents[cache_key], own.wrapped_key, aad=crypto.memory_key_aad(**where))
    return found


def memory_open(*, memory: Memory) -> OpenedMemory:
    """Open one memory row."""
    return memories_open([memory])[0]


FILTER_OPEN_BATCH = 1000  # rows opened at a time while a metadata filter scans a scope
MAX_METADATA_FILTER_SCAN = 20_000  # memories a metadata filter may open in one request (a page opens them all again)


def time_range_validate(*, since: dt.datetime | None, until: dt.datetime | None) -> None:
    """Raise naming `until` unless it is later than `since` (either may be None)."""
    if since is not None and until is not None and until <= since:
        raise MnesioError(
            f"`until` has to be later than `since` ({since.isoformat()}) but got {until.isoformat()}",
            extra={"field": "until"},
        )


def _json_same(a: object, b: object) -> bool:
    """Exact JSON equality: `true` is not `1`, `1` equals `1.0`, objects and arrays compare element-wise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_same(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def metadata_matches(metadata: dict, wanted: dict) -> bool:
    """Whether ``metadata`` holds every top-level key of ``wanted`` with exactly that JSON value."""
    return all(key in metadata and _json_same(metadata[key], value) for key, value in wanted.items())


def scope_memories_filtered(
    *,
    scope: Scope,
    as_of: int | None = None,
    subject: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    metadata: dict | None = None,
) -> QuerySet[Memory] | list[Memory]:
    """The scope's memory rows with seq <= ``as_of`` that pass the filters, in log order: what a listing pages.

    ``subject`` (external id), ``since <= created_at < until`` and ``as_of`` are SQL (a queryset comes back, so a
    page reads only its rows); an erased memory passes them and lists as erased, as in the unfiltered list.
    ``metadata`` (exact match on each given top-level key, as in memories_search) is sealed with each memory, so
    it opens the rows the other filters keep, FILTER_OPEN_BATCH at a time, and returns the matching rows as a
    list; an erased memory has no metadata and never matches. Raises naming the field.
    """
    time_range_validate(since=since, until=until)
    rows = scope_memories(scope=scope, as_of=as_of)
    if subject is not None:
        rows = rows.filter(subject__external_id__in=subject_id_variants(subject))
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    if until is not None:
        rows = rows.filter(created_at__lt=until)
    if not metadata:
        return rows
    if rows.count() > MAX_METADATA_FILTER_SCAN:  # each kept row is opened on every page: bound what one request opens
        raise MnesioError(
            f"`metadata` filters by opening every memory the other filters keep, at most {MAX_METADATA_FILTER_SCAN} "
            "per request; narrow them first with `subject`, `since`, `until` or `as_of`",
            extra={"field": "metadata", "limit": MAX_METADATA_FILTER_SCAN},
        )
    kept: list[Memory] = []
    after = 0
    while batch := list(rows.filter(seq__gt=after)[:FILTER_OPEN_BATCH]):
        for row, memory in zip(batch, memories_open(batch), strict=True):
            if not memory.erased and metadata_matches(memory.metadata or {}, metadata):
                kept.append(row)
        after = batch[-1].seq
    return kept


def scope_memories_open(*, scope: Scope, as_of: int | None = None) -> list[OpenedMemory]:
    """Return the scope's memories with seq <= ``as_of`` (all when None), opened, ordered by seq."""
    return memories_open(scope_memories(scope=scope, as_of=as_of))


def scope_memory_get(*, scope: Scope, seq: int) -> Memory:
    """Return the scope's memory at ``seq`` or raise NotFound naming `seq`."""
    memory = scope_memories(scope=scope).filter(seq=seq).first()
    if memory is None:
        raise NotFound(f"`seq` {seq} is not a memory of scope '{scope.name}'", extra={"field": "seq"})
    return memory
