"""Reads of the log: the head, a scope's memories opened (decrypted) as of a head, scope access."""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.core.validators import slug_re
from django.db.models import F, Max, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from memories import crypto
from memories.models import ErasureEvent, ErasureRequest, ErasureStatus, Memory, Scope, Subject
from mnesio_site.exceptions import MnesioError, NotFound, PermissionDenied


class MemoryIntegrityError(MnesioError):
    """A memory row failed authentication: its ciphertext was altered or copied from another row."""

    status_code = 500


@dataclass(frozen=True)
class OpenedMemory:
    """A memory as a reader sees it: the text, or ``erased=True`` and no text once its subject is shredded."""

    seq: int
    subject: str | None  # the subject's external id
    text: str | None
    erased: bool
    created_at: dt.datetime


# A seq is a PostgreSQL bigint (at most 2**63 - 1, 19 digits).
MAX_SEQ_DIGITS = 19


def log_head() -> int:
    """Return the seq of the newest committed memory (0 for an empty log)."""
    return Memory.objects.aggregate(head=Max("seq"))["head"] or 0


def _shown(value: object) -> str:
    """The received value for an error message, cut short (a query or path value can be megabytes)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def as_of_validate(as_of: object) -> int:
    """Return ``as_of`` as a head no later than the current one, or raise naming `as_of`."""
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
        raise MnesioError(f"`as_of` has to be an integer log head but got {_shown(as_of)}", extra={"field": "as_of"})
    if value < 0:
        raise MnesioError(f"`as_of` has to be >= 0 but got {value}", extra={"field": "as_of"})
    head = log_head()
    if value > head:
        raise MnesioError(
            f"`as_of` has to be at most the current log head {head} but got {value}",
            extra={"field": "as_of", "head": head},
        )
    return value


def scope_memories(*, scope: Scope, as_of: int | None = None) -> QuerySet[Memory]:
    """Return the scope's memory rows with seq <= ``as_of`` (all when None), ordered by seq."""
    rows = Memory.objects.filter(scope=scope).select_related("scope__key", "subject").order_by("seq")
    if as_of is not None:
        rows = rows.filter(seq__lte=as_of)
    return rows


@sensitive_variables()
def memories_open(memories: Iterable[Memory]) -> list[OpenedMemory]:
    """Decrypt rows (fetched with ``scope__key`` and ``subject`` selected); each data key is unwrapped once."""
    keys: dict[tuple[str, int], bytes] = {}
    opened = []
    for memory in memories:
        subject: Subject | None = memory.subject
        if subject is not None and subject.is_shredded:
            opened.append(OpenedMemory(memory.seq, subject.external_id, None, True, memory.created_at))
            continue
        if subject is not None:
            cache_key = ("subject", subject.pk)
            if cache_key not in keys:
                keys[cache_key] = crypto.unwrap(
                    subject.wrapped_key,
                    wrapped_by=subject.master_key_id,
                    aad=crypto.subject_key_aad(subject.external_id),
                )
        else:
            cache_key = ("scope", memory.scope_id)
            if cache_key not in keys:
                scope_key = memory.scope.key
                keys[cache_key] = crypto.unwrap(
                    scope_key.wrapped_key, wrapped_by=scope_key.master_key_id, aad=crypto.scope_key_aad(memory.scope_id)
                )
        aad = crypto.memory_aad(seq=memory.seq, scope_id=memory.scope_id, subject_id=memory.subject_id)
        try:
            text = crypto.unseal(keys[cache_key], memory.nonce, memory.ciphertext, aad=aad).decode()
        except crypto.InvalidTag:
            raise MemoryIntegrityError(
                f"memory seq={memory.seq} failed authentication: its ciphertext does not belong to this row",
                extra={"seq": memory.seq},
            ) from None
        opened.append(
            OpenedMemory(memory.seq, subject.external_id if subject else None, text, False, memory.created_at)
        )
    return opened


def memory_open(*, memory: Memory) -> OpenedMemory:
    """Open one memory row."""
    return memories_open([memory])[0]


def scope_memories_open(*, scope: Scope, as_of: int | None = None) -> list[OpenedMemory]:
    """Return the scope's memories with seq <= ``as_of`` (all when None), opened, ordered by seq."""
    return memories_open(scope_memories(scope=scope, as_of=as_of))


def scope_memory_get(*, scope: Scope, seq: int) -> Memory:
    """Return the scope's memory at ``seq`` or raise NotFound naming `seq`."""
    memory = scope_memories(scope=scope).filter(seq=seq).first()
    if memory is None:
        raise NotFound(f"`seq` {seq} is not a memory of scope '{scope.name}'", extra={"field": "seq"})
    return memory


def scope_get_for_user(*, user, name: str) -> Scope:
    """Return the scope called ``name`` if ``user`` is granted it; NotFound / PermissionDenied naming `scope`."""
    # A name no scope can have (not a slug, too long, a NUL that PostgreSQL refuses) is not looked up.
    max_chars = Scope._meta.get_field("name").max_length
    if not isinstance(name, str) or len(name) > max_chars or not slug_re.fullmatch(name):
        raise NotFound(
            f"`scope` {_shown(name)} does not exist (a scope name is a slug of at most {max_chars} letters, "
            "digits, '-' and '_')",
            extra={"field": "scope"},
        )
    scope = Scope.objects.filter(name=name).first()
    if scope is None:
        raise NotFound(f"`scope` '{name}' does not exist", extra={"field": "scope"})
    if not (user and user.is_authenticated and scope.grants.filter(user=user).exists()):
        raise PermissionDenied(f"you are not granted `scope` '{name}'", extra={"field": "scope"})
    return scope


def user_scopes(*, user) -> QuerySet[Scope]:
    """Return the scopes ``user`` is granted (staff get no implicit grants)."""
    if not (user and user.is_authenticated):
        return Scope.objects.none()
    return Scope.objects.filter(grants__user=user).order_by("name")


def subject_get(*, external_id: str, scope: Scope | None = None) -> Subject:
    """Return the subject (with memories in ``scope`` when given) or raise NotFound naming `subject`."""
    subjects = Subject.objects.filter(external_id=external_id)
    if scope is not None:
        subjects = subjects.filter(memories__scope=scope)
    subject = subjects.first()
    if subject is None:
        where = f" in scope '{scope.name}'" if scope is not None else ""
        raise NotFound(f"`subject` '{external_id}' has no memories{where}", extra={"field": "subject"})
    return subject


def erasure_request_status(*, erasure_request: ErasureRequest) -> str:
    """Return the request's status: the newest event's (requested, keys_shredded, views_rebuilt, failed)."""
    event = ErasureEvent.objects.filter(request=erasure_request).order_by("-id").first()
    return event.status if event else ErasureStatus.REQUESTED


def erasure_request_get(*, scope: Scope, pk: int) -> ErasureRequest:
    """Return an erasure request filed through ``scope`` or raise NotFound naming `id`."""
    request = ErasureRequest.objects.filter(pk=pk, scope=scope).select_related("subject").first()
    if request is None:
        raise NotFound(f"`id` {pk} is not an erasure request of scope '{scope.name}'", extra={"field": "id"})
    return request


def erasure_requests_unfinished(*, statuses: Iterable[str], idle_for_s: int) -> QuerySet[ErasureRequest]:
    """Return requests whose status is one of ``statuses`` and whose newest event is ``idle_for_s`` old or more.

    A request without events counts as ``requested`` since its filing (erasure_request_status agrees).
    """
    newest = ErasureEvent.objects.filter(request=OuterRef("pk")).order_by("-id")
    cutoff = timezone.now() - dt.timedelta(seconds=idle_for_s)
    rows = ErasureRequest.objects.annotate(
        status_now=Coalesce(Subquery(newest.values("status")[:1]), Value(ErasureStatus.REQUESTED.value)),
        changed_at=Coalesce(Subquery(newest.values("created_at")[:1]), F("created_at")),
    )
    return rows.filter(status_now__in=list(statuses), changed_at__lte=cutoff).order_by("id")


def scope_erasure_requests(*, scope: Scope) -> QuerySet[ErasureRequest]:
    """Return the erasure requests filed through ``scope``, newest first."""
    return ErasureRequest.objects.filter(scope=scope).select_related("subject").prefetch_related("events")
