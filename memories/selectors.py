"""Reads of the log: the head, a scope's memories opened (decrypted) as of a head, scope access."""
from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.core.exceptions import ObjectDoesNotExist
from django.core.validators import slug_re
from django.db.models import F, Max, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import MnesioError, NotFound, PermissionDenied
from core.permissions import staff_permission_check
from memories import crypto
from memories.models import (
    ErasureEvent,
    ErasureKind,
    ErasureRequest,
    ErasureStatus,
    Memory,
    MemoryKey,
    Scope,
    ScopeGrant,
    Subject,
)
from memories.tokens import TOKEN_SCOPES_ATTR


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


def _shown(value: object) -> str:
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
        raise MnesioError(f"`as_of` has to be an integer log head but got {_shown(as_of)}", extra={"field": "as_of"})
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


def scope_get_for_user(*, user, name: str) -> Scope:
    """Return the scope called ``name`` if ``user`` is granted it, else NotFound naming `scope`.

    An unknown scope and one that is not granted get the same 404 and message: a client cannot learn
    which scope names exist outside its grants.
    """
    # A name no scope can have (not a slug, too long, a NUL that PostgreSQL refuses) is not looked up.
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    max_chars = Scope._meta.get_field("name").max_length
    if not isinstance(name, str) or len(name) > max_chars or not slug_re.fullmatch(name):
        raise NotFound(
            f"`scope` {_shown(name)} does not exist (a scope name is a slug of at most {max_chars} letters, "
            "digits, '-' and '_')",
            extra={"field": "scope"},
        )
    scope = None
    if user and user.is_authenticated:
        # a deleted scope answers like one that never existed
        scope = Scope.objects.filter(
            _token_limit(user), name=name, grants__user=user, deleted_at__isnull=True
        ).first()
    if scope is None:
        raise NotFound(f"`scope` '{name}' does not exist or is not granted to you", extra={"field": "scope"})
    return scope


def scope_get_for_staff(*, user, name: str, permission: str) -> Scope:
    """Return the scope called ``name`` for a staff action needing ``permission`` (e.g. ``memories.add_scopegrant``).

    Staff (who see every scope's name in the admin anyway) are checked for the permission first (403 naming
    it), then any scope is looked up (404). Anyone else first meets ``scope_get_for_user``: a scope they
    are not granted is the same 404 as an unknown one (no probing for names), a granted one a 403.
    """
    if user and user.is_authenticated and user.is_staff:
        staff_permission_check(user=user, permission=permission)
        if isinstance(name, str):
            name = unicodedata.normalize("NFC", name)
        valid = isinstance(name, str) and slug_re.fullmatch(name)
        scope = Scope.objects.filter(_token_limit(user), name=name).first() if valid else None
        if scope is None:
            raise NotFound(f"`scope` {_shown(name)} does not exist", extra={"field": "scope"})
        return scope
    scope_get_for_user(user=user, name=name)
    staff_permission_check(user=user, permission=permission)
    raise AssertionError("unreachable: a user who is not staff never passes staff_permission_check")


def user_get(*, username: str):
    """Return the user (an API client: the owner of its tokens) called ``username``, or NotFound naming `user`."""
    from django.contrib.auth import get_user_model

    # a NUL is refused by PostgreSQL (a 500), and no username holds one: not looked up
    valid = isinstance(username, str) and "\x00" not in username and len(username) <= 1000
    user = get_user_model().objects.filter(username=username).first() if valid else None
    if user is None:
        raise NotFound(f"`user` {_shown(username)} does not exist", extra={"field": "user"})
    return user


def user_scopes(*, user) -> QuerySet[Scope]:
    """Return the scopes ``user`` is granted (staff get no implicit grants)."""
    if not (user and user.is_authenticated):
        return Scope.objects.none()
    return Scope.objects.filter(_token_limit(user), grants__user=user, deleted_at__isnull=True).order_by("name")


def _token_limit(user) -> Q:
    """The scopes the request's token may reach (memories.tokens): every one, or the pks authentication attached."""
    allowed = getattr(user, TOKEN_SCOPES_ATTR, None)
    return Q() if allowed is None else Q(pk__in=allowed)


# A token's public id: the first characters of its digest (sha512 of the secret, hex); never the secret nor its
# lookup prefix, and useless to someone who has it.
TOKEN_ID_CHARS = 16
_TOKEN_ID_RE = re.compile(rf"[0-9a-f]{{{TOKEN_ID_CHARS}}}")


def token_is_limited(*, user) -> bool:
    """Whether ``user`` came with a token limited to some of their scopes (memories.tokens)."""
    return getattr(user, TOKEN_SCOPES_ATTR, None) is not None


def token_management_check(*, user) -> None:
    """403 unless ``user`` came with a credential that reaches all their scopes (a limited token manages nothing)."""
    if getattr(user, TOKEN_SCOPES_ATTR, None) is not None:
        raise PermissionDenied(
            "this token is limited to some scopes and cannot list, create or revoke tokens; use an unlimited token",
            extra={"field": "authorization"},
        )


def user_tokens(*, user) -> QuerySet:
    """The user's live API tokens (expired ones are dead: left out), oldest first, with their profiles."""
    from knox.models import get_token_model

    token_management_check(user=user)
    live = Q(expiry__isnull=True) | Q(expiry__gt=timezone.now())
    return (get_token_model().objects.filter(live, user=user).select_related("mnesio_profile")
            .prefetch_related("mnesio_profile__scopes").order_by("created", "digest"))


def user_token_get(*, user, token_id: str):
    """The user's live token whose id is ``token_id``, or NotFound naming `token` (another user's is the same 404)."""
    token = None
    if isinstance(token_id, str) and _TOKEN_ID_RE.fullmatch(token_id):
        token = user_tokens(user=user).filter(digest__startswith=token_id).first()
    if token is None:
        raise NotFound(f"`token` {_shown(token_id)} is not one of your tokens", extra={"field": "token"})
    return token


def token_scope_ids(*, auth_token) -> frozenset[int] | None:
    """The scope pks ``auth_token`` (knox's) is limited to, or None when it reaches all its user's grants.

    Reads the profile authentication fetched with the token (``select_related("mnesio_profile")``); a limited
    token costs one query more for its scopes.
    """
    try:
        profile = auth_token.mnesio_profile
    except ObjectDoesNotExist:
        return None
    if not profile.restricted:
        return None
    return frozenset(profile.scopes.values_list("pk", flat=True))


def subject_id_variants(external_id: str) -> list[str]:
    """The stored spellings one (NFC) subject id may have: NFC, and NFD for rows stored before normalization."""
    return sorted({unicodedata.normalize("NFC", external_id), unicodedata.normalize("NFD", external_id)})


def legacy_subjects_in_scope(*, external_id: str, scope: Scope) -> QuerySet[Subject]:
    """Legacy global subjects (no scope) with this id and memories in ``scope``."""
    return Subject.objects.filter(
        scope__isnull=True, external_id__in=subject_id_variants(external_id), memories__scope=scope
    ).distinct()


def subject_get(*, external_id: str, scope: Scope | None = None) -> Subject:
    """Return the subject of ``scope`` with memories there (any scope's when None), or NotFound naming `subject`.

    A scope's subject is its own row, or a legacy global row with memories in the scope; the answer
    is the same 404 whether or not the id exists in scopes the caller is not granted.
    """
    variants = subject_id_variants(external_id)
    if scope is None:
        subject = Subject.objects.filter(external_id__in=variants).order_by("scope_id", "pk").first()
    else:
        subject = (
            Subject.objects.filter(scope=scope, external_id__in=variants, memories__scope=scope).first()
            or legacy_subjects_in_scope(external_id=external_id, scope=scope).first()
        )
    if subject is None:
        where = f" in scope '{scope.name}'" if scope is not None else ""
        raise NotFound(f"`subject` '{external_id}' has no memories{where}", extra={"field": "subject"})
    return subject


def legacy_subject_erasable_by(*, subject: Subject, user) -> bool:
    """Whether ``user`` may erase a legacy global subject through a scope: every scope holding its memories is granted.

    ``user`` None is an operator's request (their own permission is checked by the caller).
    """
    if user is None:
        return True
    granted = set(ScopeGrant.objects.filter(user=user).values_list("scope_id", flat=True))
    allowed = getattr(user, TOKEN_SCOPES_ATTR, None)
    if allowed is not None:  # a token limited to some scopes erases only what those hold
        granted &= allowed
    held_in = set(Memory.objects.filter(subject=subject).values_list("scope_id", flat=True).distinct())
    return held_in <= granted


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


# ---------------------------------------------------------------------------
# Search: BM25 over a scope's search index (memories.search_index), ranked in the database
# ---------------------------------------------------------------------------
# The index is kept by appends and erasures; a search ranks the postings of its query's terms (held by the process
# and checked against the database's head and generation on every search) and opens only the memories it returns. One BM25 and one tokenization for the whole project: the index scores exactly as
# kvengine.retrieval.Bm25 (bm25s), which the gate and kveval call.
MAX_SEARCH_TOP_K = 100
MAX_SEARCH_QUERY_CHARS = 2000
MAX_SEARCH_METADATA_KEYS = 20
SEARCH_RETRIEVERS = ("bm25", "hybrid")
HYBRID_BM25_DEPTH = 100  # BM25's list in the fusion holds at least this many (RRF reads ranks, deep ones weigh little)


@dataclass(frozen=True)
class SearchHit:
    """One search result: an opened (never erased) memory and its BM25 score for the query."""

    seq: int
    subject: str | None
    content: str
    created_at: dt.datetime
    metadata: dict
    score: float


@dataclass(frozen=True)
class RankedMemory:
    """A memory that matches a query (memory_search): its seq and BM25 score."""

    seq: int
    score: float


@dataclass(frozen=True)
class SearchResult:
    """The hits, best first, and the scope head the search read (pass it back as ``as_of`` to repeat it)."""

    as_of: int
    hits: list[SearchHit]
    retriever: str = "bm25"  # what ranked them (search_retriever)


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


def _search_query_validate(query: object) -> str:
    from kvengine.retrieval import bm25_tokenize  # no torch: the retrieval module imports bm25s only when indexing

    if not isinstance(query, str) or not bm25_tokenize(query):
        raise MnesioError(
            f"`query` has to contain at least one word (letters or digits) but got {_shown(query)}",
            extra={"field": "query"},
        )
    return query


def _top_k_validate(top_k: object, *, field: str) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_SEARCH_TOP_K:
        raise MnesioError(
            f"`{field}` has to be an integer from 1 to {MAX_SEARCH_TOP_K} but got {_shown(top_k)}", extra={"field": field}
        )
    return top_k


def search_retriever(retriever: str | None = None) -> str:
    """The retriever a search uses: ``retriever``, else MNESIO_SEARCH_RETRIEVER; always `bm25` in a model-free web
    process (MNESIO_WEB_LOADS_MODEL=false), which never loads the dense encoder."""
    from django.conf import settings

    if retriever is not None and retriever not in SEARCH_RETRIEVERS:
        raise MnesioError(f"`retriever` has to be one of {list(SEARCH_RETRIEVERS)} but got {_shown(retriever)}",
                          extra={"field": "retriever"})
    chosen = retriever or settings.MNESIO_SEARCH_RETRIEVER
    return chosen if chosen == "bm25" or settings.MNESIO_WEB_LOADS_MODEL else "bm25"


def _rank(*, scope: Scope, key: bytes | None, query: str, limit: int, retriever: str, **filters):
    """search_index.rank, or under `hybrid` its BM25 ranking fused by reciprocal rank (kvengine.retrieval's RRF)
    with the dense ranking of its candidates (memories.search_dense); a hit's score is then the fused score."""
    from memories import search_index

    if retriever == "bm25":
        return search_index.rank(scope=scope, key=key, query=query, limit=limit, **filters)
    from django.conf import settings

    from kvengine.retrieval import rrf_scores
    from memories.search_dense import dense_ranking

    page = search_index.rank(scope=scope, key=key, query=query, limit=max(limit, HYBRID_BM25_DEPTH),
                             candidates=settings.MNESIO_SEARCH_DENSE_WINDOW, **filters)
    dense = dense_ranking(scope=scope, query=query, seqs=page.candidates, generation=page.generation)
    fused = rrf_scores([[r.seq for r in page.ranked], dense])
    best = sorted(fused, key=lambda seq: (-fused[seq], seq))[:limit]
    return search_index.RankedPage(head=page.head, ranked=[search_index.Ranked(seq, fused[seq]) for seq in best])


def memory_search(*, scope: Scope, query: str, k: int, retriever: str = "bm25") -> list[RankedMemory]:
    """The seqs of the ``k`` memories of ``scope`` that best match ``query``, best first (equal scores: the earlier
    first); ``sorted(r.seq for r in ...)`` is their log order. By BM25 unless ``retriever="hybrid"`` (routed answers
    take BM25's top k; the search API follows MNESIO_SEARCH_RETRIEVER): opens nothing, one query once this process
    holds the terms' postings up to the scope's head, one more to read what it lacks; `hybrid` also opens and
    embeds the candidates this process has not embedded yet (search_retriever: never in a model-free web process).

    Erased memories are not in the index once their erasure's shred step has committed; a caller that opens
    the rows still checks each for ``erased`` (a forget in flight between its shred and that commit).
    """
    from memories import search_index

    query = _search_query_validate(query)
    k = _top_k_validate(k, field="k")
    retriever = search_retriever(retriever)
    key = search_index.index_key_for_read(scope=scope)
    page = _rank(scope=scope, key=key, query=query, limit=k, retriever=retriever)
    return [RankedMemory(r.seq, r.score) for r in page.ranked]


def memories_search(
    *,
    scope: Scope,
    query: str,
    top_k: int = 10,
    subject: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    as_of: int | None = None,
    metadata: dict | None = None,
    retriever: str | None = None,
) -> SearchResult:
    """Return the scope's memories that best match ``query`` by BM25 (or `hybrid`: search_retriever), best first,
    at most ``top_k``.

    Filters: ``subject`` (external id), ``since <= created_at < until``, ``seq <= as_of`` (default: the
    scope's head, read by the same statement as the statistics, so the reported ``as_of`` is exactly what was
    ranked), and ``metadata`` (exact match on each given top-level key). BM25's statistics are the scope's as
    of ``as_of``: the other filters choose among its memories without changing them (as a filter does in
    Lucene). Metadata is sealed, so it is checked on the ranked memories as they are opened (more are ranked
    until ``top_k`` match or none is left).
    Erased memories are never returned: they leave the index with their erasure, and any that opens as
    erased is dropped. Only ``scope``'s rows are read. Raises naming the field.
    """
    from memories import search_index

    query = _search_query_validate(query)
    top_k = _top_k_validate(top_k, field="top_k")
    time_range_validate(since=since, until=until)
    if as_of is not None:
        as_of = as_of_validate(as_of, scope=scope)
    retriever = search_retriever(retriever)
    key = search_index.index_key_for_read(scope=scope)
    wanted = subject_id_variants(subject) if subject is not None else None
    limit = top_k if not metadata else max(4 * top_k, 50)
    seen: set[int] = set()
    hits: list[SearchHit] = []
    while True:
        page = _rank(
            scope=scope, key=key, query=query, limit=limit, subject_ids_of=wanted, since=since, until=until, as_of=as_of,
            retriever=retriever,
        )
        fresh = [r for r in page.ranked if r.seq not in seen]
        seen.update(r.seq for r in fresh)
        if fresh:
            # scope_memories() says what memories_open needs joined; all of it but the scope: every row shares the
            # caller's ``scope`` instead (joining it builds a Scope and a ScopeKey per row)
            rows = scope_memories(scope=scope)
            joined = [name for name in rows.query.select_related if name != "scope"]
            by_seq = {row.seq: row for row in rows.select_related(None).select_related(*joined).filter(
                seq__in=[r.seq for r in fresh]
            )}
            for row in by_seq.values():
                row.scope = scope
            opened = {m.seq: m for m in memories_open(by_seq.values())}
            for r in fresh:
                memory = opened.get(r.seq)
                if memory is None or memory.erased or memory.text is None:
                    continue
                if metadata and not metadata_matches(memory.metadata or {}, metadata):
                    continue
                hits.append(SearchHit(
                    seq=memory.seq, subject=memory.subject, content=memory.text, created_at=memory.created_at,
                    metadata=dict(memory.metadata or {}), score=r.score,
                ))
                if len(hits) == top_k:
                    break
        if not metadata or len(hits) == top_k or len(page.ranked) < limit:
            return SearchResult(as_of=page.head if as_of is None else as_of, hits=hits, retriever=retriever)
        limit *= 4
