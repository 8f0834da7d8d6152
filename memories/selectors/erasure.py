"""Erasure requests: the subjects and memories a request erases, its status, and the requests left unfinished."""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from django.db.models import F, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from core.errors import MnesioError, NotFound
from memories.models import (
    ErasureEvent,
    ErasureKind,
    ErasureRequest,
    ErasureStatus,
    Memory,
    MemoryKey,
    Scope,
    Subject,
)

from .subjects import legacy_subject_erasable_by, subject_id_variants


def erasure_request_subjects(*, erasure_request: ErasureRequest) -> list[Subject]:
    """The subject rows an erasure request shreds.

    Filed through a scope: that scope's subject with the request's id, and a legacy global one with
    memories in the scope (filing checked that the client is granted every scope it holds memories in).
    Filed by an operator without a scope: every subject with that id, in every scope.
    Forgetting one memory shreds no subject; deleting a scope shreds every subject of that scope (legacy
    global subjects reach other scopes: their memories here are forgotten one by one instead).
    """
    if erasure_request.kind == ErasureKind.MEMORY:
        return []
    if erasure_request.kind == ErasureKind.SCOPE:
        return list(Subject.objects.filter(scope_id=erasure_request.scope_id).order_by("pk"))
    variants = subject_id_variants(erasure_request.subject.external_id)
    if erasure_request.scope_id is None:
        return list(Subject.objects.filter(external_id__in=variants).order_by("pk"))
    rows = set(Subject.objects.filter(scope_id=erasure_request.scope_id, external_id__in=variants))
    legacy = Subject.objects.filter(
        scope__isnull=True, external_id__in=variants, memories__scope_id=erasure_request.scope_id
    ).distinct()
    # checked again here, not only at filing: a legacy row reaches scopes the requester may not be granted
    rows |= {row for row in legacy if legacy_subject_erasable_by(subject=row, user=erasure_request.requested_by)}
    return sorted(rows, key=lambda row: row.pk)


def erasure_request_memories(*, erasure_request: ErasureRequest) -> QuerySet[Memory]:
    """The log rows an erasure request makes unreadable: what the views holding them must be rebuilt without.

    A subject's: every memory of its subjects; one memory's: that row; a scope's: every memory of the scope.
    """
    if erasure_request.kind == ErasureKind.MEMORY:
        return Memory.objects.filter(seq=erasure_request.memory_id)
    if erasure_request.kind == ErasureKind.SCOPE:
        return Memory.objects.filter(scope_id=erasure_request.scope_id)
    return Memory.objects.filter(subject__in=erasure_request_subjects(erasure_request=erasure_request))


def memory_keys_forgotten_lock(*, seqs: Iterable[int]) -> bool:
    """Lock the own keys of ``seqs`` until the caller's transaction ends; True when any of them is shredded.

    A compile locks its manifest's keys before storing a version (cartridges.services.compile), and
    forgetting shreds with an UPDATE of the same rows: a shred that committed first is seen here, a later
    one waits, and the erasure's rebuild then finds the stored version.
    """
    rows = MemoryKey.objects.select_for_update().filter(memory_id__in=list(seqs)).order_by("memory_id")
    return any(shredded_at is not None for shredded_at in rows.values_list("shredded_at", flat=True))


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


def erasure_requests_stuck(*, idle_for_s: int, include_failed: bool = False) -> list[int]:
    """Ids of requests stuck in `requested`/`keys_shredded` (and `failed`) for ``idle_for_s``: what the reconciler re-sends."""
    if isinstance(idle_for_s, bool) or not isinstance(idle_for_s, int) or idle_for_s < 0:
        raise MnesioError(f"`idle_for_s` has to be an integer >= 0 but got {idle_for_s!r}", extra={"field": "idle_for_s"})
    statuses = [ErasureStatus.REQUESTED, ErasureStatus.KEYS_SHREDDED] + ([ErasureStatus.FAILED] if include_failed else [])
    return list(erasure_requests_unfinished(statuses=statuses, idle_for_s=idle_for_s).values_list("pk", flat=True))


def scope_erasure_requests(*, scope: Scope) -> QuerySet[ErasureRequest]:
    """Return the erasure requests filed through ``scope``, newest first."""
    return ErasureRequest.objects.filter(scope=scope).select_related("subject").prefetch_related("events")
