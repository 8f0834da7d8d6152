"""What erasure destroys beyond cartridges: evaluation cases about what was erased, and pending answer requests.

Both are called from the erasure flow (``cartridge_views_rebuild``) after the keys are shredded, for every
erasure kind (a subject, one memory, a whole scope), and both are safe to run twice. They take ids, so whoever
orchestrates erasure decides which subjects, memories and scopes.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db.models import Q
from django.utils import timezone

from memories.models import Memory

from ..models import AnswerRequest, EvaluationCase

log = logging.getLogger("cartridges")


def evaluation_cases_forget(
    *, subject_ids: Sequence[int] = (), memory_seqs: Sequence[int] = (), scope_ids: Sequence[int] = ()
) -> int:
    """Destroy the key and sealed content of every live case about what an erasure erased; return how many.

    A case goes when it is linked to one of ``subject_ids``, quotes one of ``memory_seqs`` (recorded at
    creation; a case made before quotes were recorded goes when any memory of its scope is forgotten), or
    belongs to one of ``scope_ids`` (a deleted scope: every case, whatever it is about). The rows stay, marked
    erased with a timestamp (the gate records them as erased, the API and admin list them with no text).
    Without the key, a copy of the sealed bytes in a backup cannot be opened either.
    """
    about = Q(pk__in=[])
    if subject_ids:
        about |= Q(pk__in=EvaluationCase.objects.filter(subjects__in=list(subject_ids)).values("pk"))
    if memory_seqs:
        forgotten_scopes = Memory.objects.filter(seq__in=list(memory_seqs)).values("scope_id")
        about |= Q(pk__in=EvaluationCase.objects.filter(memories__seq__in=list(memory_seqs)).values("pk"))
        about |= Q(memories_recorded=False, scope_id__in=forgotten_scopes)
    if scope_ids:
        about |= Q(scope_id__in=list(scope_ids))
    num = EvaluationCase.objects.filter(about, erased_at__isnull=True).update(
        wrapped_key=None, sealed=None, erased_at=timezone.now()
    )
    if num:
        log.info("evaluation cases erased=%d subjects=%s memories=%s scopes=%s", num, sorted(subject_ids),
                 sorted(memory_seqs), sorted(scope_ids))
    return num


def answer_requests_discard(*, scope_ids: list[int]) -> int:
    """Delete every answer request (pending or answered, not collected) of ``scope_ids``; return how many.

    An answer filed or computed before an erasure may quote the erased subject's memories; its caller can
    ask again and get an answer from the rebuilt cartridge.
    """
    if not scope_ids:
        return 0
    num, _ = AnswerRequest.objects.filter(scope_id__in=scope_ids).delete()
    if num:
        log.info("answer requests discarded=%d scopes=%s", num, sorted(scope_ids))
    return num
