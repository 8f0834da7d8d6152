"""What erasure destroys beyond cartridges: evaluation cases about the erased subjects, and pending answer requests.

Both are called from the erasure flow (``cartridge_views_rebuild``) after the subject's key is shredded, and
both are safe to run twice. They take ids, so whoever orchestrates erasure decides which subjects and scopes.
"""
from __future__ import annotations

import logging

from django.utils import timezone

from ..models import AnswerRequest, EvaluationCase

log = logging.getLogger("cartridges")


def evaluation_cases_forget(*, subject_ids: list[int]) -> int:
    """Destroy the key and sealed content of every live case linked to one of ``subject_ids``; return how many.

    The rows stay, marked erased with a timestamp (the gate records them as erased, the API and admin list
    them with no text). Without the key, a copy of the sealed bytes in a backup cannot be opened either.
    """
    if not subject_ids:
        return 0
    linked = EvaluationCase.objects.filter(subjects__in=subject_ids).values_list("pk", flat=True)
    num = EvaluationCase.objects.filter(pk__in=linked, erased_at__isnull=True).update(
        wrapped_key=None, sealed=None, erased_at=timezone.now()
    )
    if num:
        log.info("evaluation cases erased=%d subjects=%s", num, sorted(subject_ids))
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
