"""Answering a question for a scope from its active cartridge (or, explicitly, by re-reading the text).

Decision: answering is synchronous in the calling process (the API process keeps its own engine: the
model loaded once and an LRU of cartridges). There is no Celery task that takes the question, because a
task's arguments sit in the broker in plaintext. An AnswerRecord keeps the version, mode and timings,
never the question or the answer.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings

from memories.selectors import log_head, scope_memories_open
from mnesio_site.exceptions import MnesioError

from .. import conf, engine
from ..models import AnswerRecord, EvaluationCase
from ..selectors import active_configuration, active_version
from .errors import NoActiveCartridge, NothingToCompile

log = logging.getLogger("cartridges")

MODES = ["cartridge", "text"]


@dataclass(frozen=True)
class AnswerResult:
    """An answer, the version it came from (None in text mode), and how long it took."""

    answer: str
    version_id: int | None
    mode: str  # "cartridge" | "text"
    ttft_s: float
    total_s: float
    num_context_tokens: int
    num_prompt_tokens: int
    note: str = ""  # says so when the answer re-read the memories as text instead of a cartridge

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def question_validate(question: object) -> str:
    """Return the question stripped, or raise naming `question`."""
    if not isinstance(question, str) or not question.strip():
        raise MnesioError("`question` has to be non-empty text", extra={"field": "question"})
    limit = int(getattr(settings, "MNESIO_MAX_QUESTION_CHARS", 2000))
    if len(question) > limit:
        raise MnesioError(
            f"`question` has to be at most {limit} characters but got {len(question)}", extra={"field": "question"}
        )
    return question.strip()


def cartridge_answer(*, scope, question: str, mode: str = "cartridge", actor=None) -> AnswerResult:
    """Answer ``question`` for ``scope`` from its active cartridge, or by re-reading the text when mode="text"."""
    question = question_validate(question)
    if mode not in MODES:
        raise MnesioError(f"`mode` has to be one of {MODES} but got {mode!r}", extra={"field": "mode"})
    config = active_configuration()
    max_new = conf.answer_max_new_tokens()
    if mode == "cartridge":
        version = active_version(scope=scope, configuration=config)
        if version is None:
            raise NoActiveCartridge(
                f"`scope` '{scope.name}' has no active cartridge under the configuration {config.key()}; "
                "compile, evaluate and activate one, or ask with mode='text' to re-read the memories",
                extra={"field": "scope"},
            )
        cartridge, backend = engine.cartridge_load(version=version, config=config)
        answer = backend.answer(cartridge, question, max_new_tokens=max_new)
        note = ""
    else:
        version = None
        texts = [m.text for m in scope_memories_open(scope=scope, as_of=log_head()) if not m.erased]
        if not texts:
            raise NothingToCompile(f"`scope` '{scope.name}' has no memories to re-read", extra={"field": "scope"})
        answer = engine.backend_for(config).answer_from_text(texts, question, max_new_tokens=max_new)
        note = "answered by re-reading the memories as text (mode='text'), not from a cartridge"
    AnswerRecord.objects.create(
        scope=scope,
        version=version,
        mode=mode,
        ttft_s=answer.ttft_s,
        total_s=answer.total_s,
        num_context_tokens=answer.num_context_tokens,
        num_prompt_tokens=answer.num_prompt_tokens,
        actor=actor if getattr(actor, "is_authenticated", False) else None,
    )
    log.info("answered scope=%s mode=%s version=%s ttft_s=%.4f", scope.pk, mode, getattr(version, "pk", None), answer.ttft_s)
    return AnswerResult(
        answer=answer.text,
        version_id=version.pk if version else None,
        mode=mode,
        ttft_s=answer.ttft_s,
        total_s=answer.total_s,
        num_context_tokens=answer.num_context_tokens,
        num_prompt_tokens=answer.num_prompt_tokens,
        note=note,
    )


def evaluation_case_add(*, scope, question: str, answers: list[str], actor=None) -> EvaluationCase:
    """Attach an evaluation case (a question and its accepted answers) to ``scope`` for the gate."""
    question = question_validate(question)
    if not isinstance(answers, list) or not answers:
        raise MnesioError("`answers` has to be a non-empty list of strings", extra={"field": "answers"})
    if not all(isinstance(a, str) and a.strip() for a in answers):
        raise MnesioError("`answers` has to hold only non-empty strings", extra={"field": "answers"})
    return EvaluationCase.objects.create(
        scope=scope,
        question=question,
        answers=[a.strip() for a in answers],
        created_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
