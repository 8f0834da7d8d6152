"""Writes to the log: appends, scopes and grants, shredding, erasure requests, master-key rotation.

The log has no update or delete service. The only changes to existing rows are the two a
subject key allows (a one-way shred, a re-wrap by a new master key), and both go through here.
"""
from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction
from django.db.models import F, Max
from django.utils import timezone
from django.utils.text import slugify

from core.errors import Conflict, MnesioError
from memories import crypto, keyring, registry
from memories.models import (
    ErasureEvent,
    ErasureRequest,
    ErasureStatus,
    LogHead,
    Memory,
    Scope,
    ScopeGrant,
    ScopeKey,
    Subject,
)
from memories.selectors import (
    erasure_request_status,
    erasure_request_subjects,
    erasure_requests_unfinished,
    legacy_subjects_in_scope,
    memory_open,
    subject_get,
    subject_id_variants,
)

logger = logging.getLogger("memories")

MAX_SUBJECT_CHARS = 200
MAX_IDEMPOTENCY_KEY_CHARS = 200
MAX_REASON_CHARS = 2000


def _max_memory_bytes() -> int:
    from django.conf import settings

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
    return unicodedata.normalize("NFC", value)


# ---------------------------------------------------------------------------
# Scopes and grants
# ---------------------------------------------------------------------------
def scope_create(*, name: str, description: str = "", actor=None) -> Scope:
    """Create a scope; ``name`` must be a slug (letters, digits, '-', '_'), taken in Unicode NFC."""
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    if not isinstance(name, str) or not name or slugify(name) != name.lower() or len(name) > 100:
        raise MnesioError(f"`name` has to be a slug of at most 100 characters but got {name!r}", extra={"field": "name"})
    if Scope.objects.filter(name=name).exists():
        raise Conflict(f"`name` '{name}' is already a scope", extra={"field": "name"})
    scope = Scope.objects.create(name=name, description=description)
    logger.info("scope created name=%s actor=%s", scope.name, getattr(actor, "pk", None))
    return scope


def scope_grant(*, scope: Scope, user, actor=None) -> ScopeGrant:
    """Grant ``user`` the use of ``scope`` (idempotent)."""
    grant, _ = ScopeGrant.objects.get_or_create(scope=scope, user=user)
    logger.info("scope granted scope=%s user=%s actor=%s", scope.name, user.pk, getattr(actor, "pk", None))
    return grant


# ---------------------------------------------------------------------------
# Appends
# ---------------------------------------------------------------------------
class _AlreadyAppended(Exception):
    """Raised inside the append transaction to roll back the seq it took (no gap) and return the original."""

    def __init__(self, memory: Memory):
        self.memory = memory


def _seq_allocate() -> int:
    """Take the next seq. Must run inside the append transaction: the counter row stays locked until commit.

    The UPDATE comes first so it takes the lock (PostgreSQL's row lock, SQLite's write lock) before
    anything is read; concurrent appends queue here, and seqs become visible in commit order with no gap.
    """
    assert transaction.get_connection().in_atomic_block
    if not LogHead.objects.filter(pk=1)._privileged_update(head=F("head") + 1):
        # First append (or a test database that was flushed): start the counter where the log ends.
        start = Memory.objects.aggregate(head=Max("seq"))["head"] or 0
        LogHead.objects.bulk_create([LogHead(pk=1, head=start)], ignore_conflicts=True)
        LogHead.objects.filter(pk=1)._privileged_update(head=F("head") + 1)
    return LogHead.objects.values_list("head", flat=True).get(pk=1)


def _scope_data_key(scope: Scope) -> bytes:
    """Return the scope's data key, creating it on the scope's first memory without a subject."""
    aad = crypto.scope_key_aad(scope.pk)
    row = ScopeKey.objects.filter(scope=scope).first()
    if row is None:
        data_key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(data_key, aad=aad)
        ScopeKey.objects.create(scope=scope, wrapped_key=wrapped, master_key_id=kid)
        return data_key
    return crypto.unwrap(row.wrapped_key, wrapped_by=row.master_key_id, aad=aad)


def _subject_data_key(external_id: str, scope: Scope) -> tuple[Subject, bytes]:
    """Return the scope's subject and its data key, creating both on the subject's first memory in the scope.

    A shredded subject is refused (409): its key is gone for good and no new one is made silently. Only
    this scope's subject (or a legacy global one with memories here) is looked at, so the answer says
    nothing about the same id in scopes the caller may not be granted.
    """
    subject = Subject.objects.filter(scope=scope, external_id__in=subject_id_variants(external_id)).first()
    if subject is None:
        legacy = legacy_subjects_in_scope(external_id=external_id, scope=scope).filter(shredded_at__isnull=False).first()
        if legacy is not None:
            subject = legacy  # an erased legacy subject of this scope stays erased here (the 409 below)
    if subject is None:
        aad = crypto.subject_key_aad(external_id, scope.pk)
        data_key = crypto.new_data_key()
        wrapped, kid = crypto.wrap(data_key, aad=aad)
        subject = Subject.objects.create(scope=scope, external_id=external_id, wrapped_key=wrapped, master_key_id=kid)
        return subject, data_key
    aad = crypto.subject_key_aad(subject.external_id, subject.scope_id)
    if subject.is_shredded:
        raise Conflict(
            f"`subject` '{external_id}' was erased at {subject.shredded_at.isoformat()}; its key is destroyed and "
            "new memories for it are refused. Use a new subject id for a new person.",
            extra={"field": "subject", "shredded_at": subject.shredded_at.isoformat()},
        )
    return subject, crypto.unwrap(subject.wrapped_key, wrapped_by=subject.master_key_id, aad=aad)


def _idempotent_result(existing: Memory, *, subject: str | None, content: str) -> Memory:
    """Return the original row for a repeated idempotency key, or 409 if the repeat asks for something else."""
    existing_subject = unicodedata.normalize("NFC", existing.subject.external_id) if existing.subject_id else None
    if existing_subject != subject:
        raise Conflict(
            f"`idempotency_key` was already used in this scope for memory seq={existing.seq} with another subject",
            extra={"field": "idempotency_key", "seq": existing.seq},
        )
    opened = memory_open(memory=existing)
    if not opened.erased and opened.text != content:
        raise Conflict(
            f"`idempotency_key` was already used in this scope for memory seq={existing.seq} with other content",
            extra={"field": "idempotency_key", "seq": existing.seq},
        )
    existing.appended = False
    return existing


def memory_append(
    *,
    scope: Scope,
    subject: str | None = None,
    content: str,
    idempotency_key: str | None = None,
    actor=None,
) -> Memory:
    """Append one memory to the log, sealed with its subject's key (or the scope's key without a subject).

    A repeated ``idempotency_key`` in the same scope returns the original row (``memory.appended`` is
    False) and writes nothing; a repeat with other content or subject is a 409. Seq is taken under
    the counter lock inside the same transaction as the insert, so a failed append leaves no gap.
    """
    data = content_validate(content)
    if subject is not None:
        subject = subject_id_validate(subject)
    if idempotency_key is not None:
        idempotency_key = _token_validate(idempotency_key, field="idempotency_key", max_chars=MAX_IDEMPOTENCY_KEY_CHARS)
        existing = Memory.objects.filter(scope=scope, idempotency_key=idempotency_key).select_related(
            "scope__key", "subject"
        ).first()
        if existing is not None:
            return _idempotent_result(existing, subject=subject, content=content)
    try:
        with transaction.atomic():
            seq = _seq_allocate()
            if idempotency_key is not None:
                # Re-check under the lock: a concurrent append with the same key may have committed meanwhile.
                existing = Memory.objects.filter(scope=scope, idempotency_key=idempotency_key).select_related(
                    "scope__key", "subject"
                ).first()
                if existing is not None:
                    raise _AlreadyAppended(existing)
            if subject is None:
                subject_row, data_key = None, _scope_data_key(scope)
            else:
                subject_row, data_key = _subject_data_key(subject, scope)
            aad = crypto.memory_aad(seq=seq, scope_id=scope.pk, subject_id=subject_row.pk if subject_row else None)
            nonce, ciphertext = crypto.seal(data_key, data, aad=aad)
            memory = Memory.objects.create(
                seq=seq,
                scope=scope,
                subject=subject_row,
                idempotency_key=idempotency_key,
                nonce=nonce,
                ciphertext=ciphertext,
            )
    except _AlreadyAppended as exc:
        return _idempotent_result(exc.memory, subject=subject, content=content)
    memory.appended = True
    logger.info("memory appended seq=%s scope=%s actor=%s", seq, scope.name, getattr(actor, "pk", None))
    return memory


# ---------------------------------------------------------------------------
# Shredding and erasure requests
# ---------------------------------------------------------------------------
def subject_shred(*, subject: Subject) -> bool:
    """Destroy the subject's key material for good (one way); True if this call shredded it."""
    now = timezone.now()
    shredded = Subject.objects.filter(pk=subject.pk, shredded_at__isnull=True)._privileged_update(
        wrapped_key=None, shredded_at=now
    )
    subject.refresh_from_db(fields=["wrapped_key", "shredded_at"])
    if shredded:
        logger.info("subject shredded subject_id=%s", subject.pk)
    return bool(shredded)


def _event_record(*, erasure_request: ErasureRequest, status: str, actor=None, detail: str = "") -> bool:
    """Append a status event; False if that step was already recorded (a concurrent or repeated run)."""
    try:
        with transaction.atomic():
            ErasureEvent.objects.create(request=erasure_request, status=status, actor=actor, detail=detail[:2000])
    except IntegrityError:
        return False
    return True


def erasure_request_file(
    *,
    subject: str,
    requested_by,
    reason: str,
    scope: Scope | None = None,
    enqueue: bool = False,
) -> ErasureRequest:
    """File an erasure request for a subject (status ``requested``); ``enqueue`` queues processing after commit.

    With ``scope`` (an API client's request) it erases the subject of that scope only, and the subject
    must have memories there (404 otherwise, the same answer whether or not the id exists elsewhere).
    A legacy global subject (filed before subjects were per scope) is covered only when every scope
    holding its memories is granted to ``requested_by``; otherwise the request is refused and an
    operator erases it everywhere. Without ``scope`` it is an operator's erasure in every scope: the
    caller (admin, command) checks the `memories.erase_subject_everywhere` permission.
    """
    external_id = subject_id_validate(subject)
    if not isinstance(reason, str) or not reason.strip():
        raise MnesioError("`reason` has to be non-empty text", extra={"field": "reason"})
    if len(reason) > MAX_REASON_CHARS:
        raise MnesioError(
            f"`reason` has to be at most {MAX_REASON_CHARS} characters but got {len(reason)}", extra={"field": "reason"}
        )
    subject_row = subject_get(external_id=external_id, scope=scope)
    if scope is not None and subject_row.scope_id is None:
        granted = set(ScopeGrant.objects.filter(user=requested_by).values_list("scope_id", flat=True)) if requested_by else set()
        held_in = set(Memory.objects.filter(subject=subject_row).values_list("scope_id", flat=True).distinct())
        if not held_in <= granted:
            raise Conflict(
                f"`subject` '{external_id}' was filed before subjects were kept per scope and cannot be erased "
                "through one scope; ask an operator to erase it everywhere",
                extra={"field": "subject", "kind": "legacy_subject_needs_operator"},
            )
    with transaction.atomic():
        erasure_request = ErasureRequest.objects.create(
            subject=subject_row, scope=scope, requested_by=requested_by, reason=reason
        )
        _event_record(erasure_request=erasure_request, status=ErasureStatus.REQUESTED, actor=requested_by)
        if enqueue:
            erasure_request_enqueue(erasure_request=erasure_request)
    logger.info("erasure request filed id=%s subject_id=%s", erasure_request.pk, subject_row.pk)
    return erasure_request


def erasure_request_enqueue(*, erasure_request: ErasureRequest) -> None:
    """Queue ``erasure_request_process_task`` for the request once the current transaction commits."""
    from memories.tasks import erasure_request_process_task

    pk = erasure_request.pk
    # robust: with tasks run in-process (no broker), a failing rebuild must not turn the caller's
    # committed filing into an error; the failure is logged and recorded as a `failed` event.
    transaction.on_commit(lambda: erasure_request_process_task.delay(pk), robust=True)


def erasure_requeue_grace_s() -> int:
    """How long a request may sit unfinished before it is re-queued: past the erasure task's hard time limit.

    Within it the task may still be running (or waiting behind compiles on the gpu queue); after it, the
    message is presumed lost (a broker restarted without persistence, a worker killed before it acked).
    """
    from django.conf import settings

    return int(getattr(settings, "CELERY_TASK_TIME_LIMIT", 1800)) + 600


@dataclass(frozen=True)
class RequeueReport:
    """What ``erasure_requests_requeue`` found and sent."""

    requeued: list[int]  # ids whose processing task was sent again
    errors: list[int]  # ids whose send (or in-process run) raised; logged, picked up by the next run


def erasure_requests_requeue(
    *, idle_for_s: int, include_failed: bool = False, expires_s: int | None = None, dry_run: bool = False
) -> RequeueReport:
    """Send processing again for requests stuck in `requested`/`keys_shredded` (and `failed`) for ``idle_for_s``.

    The reconciler for lost broker messages (manage.py erasure_requeue, and a periodic task). A request
    whose message was not lost after all is processed twice, which is harmless: erasure_request_process
    skips every step already recorded. ``expires_s`` lets a re-sent message that waited that long be
    discarded by the worker (the periodic task sends a fresh one each run, so a queue without consumers
    does not fill up with copies).
    """
    from memories.tasks import erasure_request_process_task

    if isinstance(idle_for_s, bool) or not isinstance(idle_for_s, int) or idle_for_s < 0:
        raise MnesioError(f"`idle_for_s` has to be an integer >= 0 but got {idle_for_s!r}", extra={"field": "idle_for_s"})
    statuses = [ErasureStatus.REQUESTED, ErasureStatus.KEYS_SHREDDED] + ([ErasureStatus.FAILED] if include_failed else [])
    stuck = list(erasure_requests_unfinished(statuses=statuses, idle_for_s=idle_for_s).values_list("pk", "status_now"))
    requeued: list[int] = []
    errors: list[int] = []
    for pk, status in stuck:
        if dry_run:
            requeued.append(pk)
            continue
        try:
            erasure_request_process_task.apply_async(args=[pk], expires=expires_s)
        except Exception:  # a broker still down: the next run tries again
            logger.exception("erasure request requeue failed id=%s status=%s", pk, status)
            errors.append(pk)
            continue
        logger.warning("erasure request re-queued id=%s status=%s idle_for_s>=%s", pk, status, idle_for_s)
        requeued.append(pk)
    return RequeueReport(requeued=requeued, errors=errors)


def erasure_request_process(*, erasure_request: ErasureRequest, actor=None) -> ErasureRequest:
    """Shred the subjects' keys, record ``keys_shredded``, run every view rebuilder, record ``views_rebuilt``.

    A rebuilder that raises records ``failed`` with the reason (and the request can be processed
    again). Safe to run twice: each step checks what is already recorded, the shred is a conditional
    update, and each step's event is unique per request.
    """
    done = set(ErasureEvent.objects.filter(request=erasure_request).values_list("status", flat=True))
    if ErasureStatus.VIEWS_REBUILT in done:
        return erasure_request
    if ErasureStatus.KEYS_SHREDDED not in done:
        with transaction.atomic():
            # The shred's row lock orders it against compiles: a compile locks its manifest's subjects
            # before storing a version (cartridges.services.compile), so once this commits no compile
            # can store a version holding these subjects, and every earlier one is visible to the rebuild.
            for subject in erasure_request_subjects(erasure_request=erasure_request):
                subject_shred(subject=subject)
            _event_record(erasure_request=erasure_request, status=ErasureStatus.KEYS_SHREDDED, actor=actor)
    rebuilders = registry.view_rebuilders()
    for rebuilder in rebuilders:
        name = getattr(rebuilder, "__qualname__", repr(rebuilder))
        try:
            rebuilder(erasure_request)
        except Exception as exc:  # any failure is recorded, not lost; the task retries
            logger.exception("erasure view rebuilder failed id=%s rebuilder=%s", erasure_request.pk, name)
            _event_record(
                erasure_request=erasure_request,
                status=ErasureStatus.FAILED,
                actor=actor,
                detail=f"{name}: {type(exc).__name__}: {exc}"[:2000],
            )
            return erasure_request
    _event_record(
        erasure_request=erasure_request,
        status=ErasureStatus.VIEWS_REBUILT,
        actor=actor,
        detail=f"{len(rebuilders)} view rebuilder(s) ran",
    )
    logger.info("erasure request processed id=%s status=%s", erasure_request.pk, erasure_request_status(erasure_request=erasure_request))
    return erasure_request


# ---------------------------------------------------------------------------
# Master-key rotation
# ---------------------------------------------------------------------------
@dataclass(frozen=True)
class RotationReport:
    """What ``master_key_rotate`` did: keys re-wrapped in all, by table, and keys that were already current."""

    master_key_id: str
    num_rewrapped: int
    num_already_current: int
    by_table: dict[str, int] = field(default_factory=dict)


def master_key_rotate() -> RotationReport:
    """Re-wrap every live wrapped key of every registered table (memories.keyring) with the current master key.

    Keys wrapped by ``MNESIO_MASTER_KEY_OLD`` are unwrapped with it; memory rows, blobs and sealed bytes are
    not touched. Refused before anything changes when a live key was wrapped by a master key this process
    does not know. Each key is re-wrapped in its own transaction under a row lock (a concurrent shred wins
    or waits), so the command can be re-run after an interruption.
    """
    current_id = crypto.master_key_id(crypto.master_key())
    num_current = keyring.keys_already_current()
    by_table = keyring.keys_rewrap()
    num_rewrapped = sum(by_table.values())
    logger.info("master key rotated id=%s rewrapped=%s", current_id, num_rewrapped)
    return RotationReport(
        master_key_id=current_id, num_rewrapped=num_rewrapped, num_already_current=num_current, by_table=by_table
    )
