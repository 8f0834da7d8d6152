"""Evaluation cases: an operator's question and accepted answers for the gate, sealed like a memory and linked to
the subjects and memories it quotes, so erasing any of them erases the case (services/forget.py)."""
from __future__ import annotations

import json
import logging

from django.db import transaction

from core.errors import Conflict, MnesioError
from kvengine.text import normalize_answer
from memories import crypto
from memories.models import Memory, Scope, Subject
from memories.selectors import (
    legacy_subjects_in_scope,
    log_head,
    memory_keys_forgotten_lock,
    scope_memories_open,
    subject_id_variants,
)
from memories.services import subject_id_validate

from ..models import EvaluationCase
from ..selectors import evaluation_case_aad
from .ask import prompt_validate

log = logging.getLogger("cartridges")

MAX_CASE_SUBJECTS = 100


def evaluation_case_subjects_resolve(*, scope, subjects: object) -> list[Subject]:
    """Return the subjects named by external id, each of which has to have memories in ``scope`` and not be erased."""
    if not isinstance(subjects, list) or not all(isinstance(x, str) and x.strip() for x in subjects):
        raise MnesioError("`subjects` has to be a list of subject ids (non-empty strings)", extra={"field": "subjects"})
    if len(subjects) > MAX_CASE_SUBJECTS:
        raise MnesioError(f"`subjects` has to hold at most {MAX_CASE_SUBJECTS} ids but got {len(subjects)}",
                          extra={"field": "subjects"})
    wanted = sorted({subject_id_validate(x) for x in subjects})
    # only subjects of this scope: a subject known elsewhere is as unknown here as one that never existed
    rows = {}
    for external_id in wanted:
        row = (
            Subject.objects.filter(scope=scope, external_id__in=subject_id_variants(external_id), memories__scope=scope).first()
            or legacy_subjects_in_scope(external_id=external_id, scope=scope).first()
        )
        if row is not None:
            rows[external_id] = row
    unknown = [x[:200] for x in wanted if x not in rows]
    if unknown:
        raise MnesioError(
            f"`subjects` has to name subjects with memories in scope '{scope.name}' but got unknown {unknown}",
            extra={"field": "subjects", "unknown": unknown},
        )
    erased = sorted(x for x, row in rows.items() if row.is_shredded)
    if erased:
        raise Conflict(f"`subjects` {erased} were erased; a case about them is refused", extra={"field": "subjects"})
    return list(rows.values())


def _memories_quoted(*, scope, question: str, answers: list[str]) -> list[tuple[int, int | None]]:
    """(seq, subject pk) of the scope's memories a case quotes: an accepted answer in their text, or their whole
    text in the question (normalized as the gate's answers are, kvengine.text.normalize_answer, whole words)."""
    wanted = [f" {n} " for n in (normalize_answer(a) for a in answers) if n]
    asked = f" {normalize_answer(question)} "
    found = []
    for memory in scope_memories_open(scope=scope, as_of=log_head()):
        if memory.erased:
            continue
        said = normalize_answer(memory.text)
        text = f" {said} "
        if any(w in text for w in wanted) or (said and f" {said} " in asked):
            found.append((memory.seq, memory.subject_id))
    return found


def evaluation_case_add(
    *, scope, question: str, answers: list[str], subjects: list[str] | None = None, actor=None
) -> EvaluationCase:
    """Attach a sealed evaluation case to ``scope`` for the gate, linked to the subjects it concerns.

    The subjects are ``subjects`` (external ids with memories in the scope) plus every subject whose memory
    quotes an accepted answer now; the memories are those _memories_quoted finds. Erasing any of those subjects,
    forgetting any of those memories or deleting the scope erases the case (services.forget). The subject rows
    and the memories' own keys are locked while the case is linked, so an erasure either sees the link or is
    seen here (refused).
    """
    question = prompt_validate(question)
    if not isinstance(answers, list) or not answers:
        raise MnesioError("`answers` has to be a non-empty list of strings", extra={"field": "answers"})
    if not all(isinstance(a, str) and a.strip() for a in answers):
        raise MnesioError("`answers` has to hold only non-empty strings", extra={"field": "answers"})
    answers = [a.strip() for a in answers]
    given = evaluation_case_subjects_resolve(scope=scope, subjects=subjects) if subjects is not None else []
    quoted = _memories_quoted(scope=scope, question=question, answers=answers)
    subject_ids = {s.pk for s in given} | {subject_id for _, subject_id in quoted if subject_id is not None}
    with transaction.atomic():
        # the scope row first: a deletion committed before is seen here; one after waits and then erases this case
        if not Scope.objects.select_for_update().filter(pk=scope.pk, deleted_at__isnull=True).exists():
            raise Conflict(f"scope '{scope.name}' was deleted; a case about it is refused", extra={"field": "scope"})
        linked = list(Subject.objects.select_for_update().filter(pk__in=subject_ids).order_by("pk"))
        erased = sorted(s.external_id for s in linked if s.is_shredded)
        if erased:  # erased between the checks above and this lock
            raise Conflict(f"`subjects` {erased} were erased; a case about them is refused", extra={"field": "subjects"})
        # a memory forgotten since it was read above: its shred committed, so its erasure may have run already
        forgotten = memory_keys_forgotten_lock(seqs=[seq for seq, _ in quoted])
        if forgotten:
            raise Conflict("a memory this case quotes was forgotten; a case about it is refused", extra={"field": "answers"})
        case = EvaluationCase.objects.create(
            scope=scope, created_by=actor if getattr(actor, "is_authenticated", False) else None, memories_recorded=True
        )
        # the associated data names the row, so the key and the content are sealed once the id exists
        key = crypto.new_data_key()
        wrapped, wrapped_by = crypto.wrap(key, aad=evaluation_case_aad(case.pk, "key"))
        content = json.dumps({"question": question, "answers": answers}).encode()
        EvaluationCase.objects.filter(pk=case.pk).update(
            wrapped_key=wrapped, wrapped_by=wrapped_by, sealed=crypto.seal_box(key, content, aad=evaluation_case_aad(case.pk, "content"))
        )
        case.subjects.set(linked)
        case.memories.set(Memory.objects.filter(seq__in=[seq for seq, _ in quoted]))
    case.refresh_from_db()
    log.info("evaluation case added id=%s scope=%s num_subjects=%d", case.pk, scope.pk, len(linked))
    return case
