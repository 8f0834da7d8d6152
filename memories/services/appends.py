"""Appends to the log: one sealed row per memory, seqs without gaps, idempotency keys honoured."""
from __future__ import annotations

import logging
import unicodedata

from django.db import transaction
from django.db.models import F, Max

from core.errors import Conflict
from memories import crypto
from memories.models import LogHead, Memory, Scope, ScopeKey, Subject
from memories.selectors import legacy_subjects_in_scope, memory_open, subject_id_variants

from .validation import MAX_IDEMPOTENCY_KEY_CHARS, _token_validate, content_validate, subject_id_validate

logger = logging.getLogger("memories")


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
    # locked until the append commits: a shred (an UPDATE of this row) then either comes first and is seen
    # below (409), or waits for the append, whose memory the erasure's rebuild then finds and leaves out
    subject = (
        Subject.objects.select_for_update().filter(scope=scope, external_id__in=subject_id_variants(external_id)).first()
    )
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

