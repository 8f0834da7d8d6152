"""What erasure destroys beyond cartridges: pending answer requests of the affected scopes.

It is called from the erasure flow (``cartridge_views_rebuild``) after the subject's key is shredded, and
is safe to run twice. It takes ids, so whoever orchestrates erasure decides which subjects and scopes.
"""
from __future__ import annotations

import logging

from ..models import AnswerRequest

log = logging.getLogger("cartridges")


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
