"""Subjects: the stored spellings of an id, the rows a scope's id names, and who may erase a legacy (global) one."""
from __future__ import annotations

import unicodedata

from django.db.models import QuerySet

from core.errors import NotFound
from memories.models import (
    Memory,
    Scope,
    ScopeGrant,
    Subject,
)
from memories.tokens import TOKEN_SCOPES_ATTR


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
