"""Answering a question for a scope from its active cartridge (or, explicitly, by re-reading the text).

Decision: answering is synchronous in the calling process by default (the API process keeps its own
engine: the model loaded once and an LRU of cartridges). For a fleet where only GPU workers hold the
model, a question can instead be filed as an AnswerRequest (sealed with a key of its own, wrapped by the
master key), answered by ``cartridge_answer_task(answer_request_id)`` on the gpu queue, and collected
once: collecting opens the sealed answer and deletes the row with its key. A task's arguments never hold
the question (they would sit in the broker in plaintext). An AnswerRecord keeps the version, mode and
timings, never the question or the answer.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from memories import crypto
from memories.selectors import log_head, scope_memories_open
from mnesio_site.exceptions import Conflict, MnesioError

from .. import conf, engine
from ..models import AnswerRecord, AnswerRequest, EvaluationCase
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


def _request_aad(request_id: int, part: str) -> bytes:
    return f"mnesio:answer-request:v1|{request_id}|{part}".encode()


@sensitive_variables()
def _request_key(request: AnswerRequest) -> bytes:
    return crypto.unwrap(bytes(request.wrapped_key), wrapped_by=request.wrapped_by, aad=_request_aad(request.pk, "key"))


@sensitive_variables()
def _seal(key: bytes, data: bytes, aad: bytes) -> bytes:
    nonce, ciphertext = crypto.seal(key, data, aad=aad)
    return nonce + ciphertext


@sensitive_variables()
def _open(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    sealed = bytes(sealed)
    return crypto.unseal(key, sealed[: crypto.NONCE_BYTES], sealed[crypto.NONCE_BYTES :], aad=aad)


@sensitive_variables()
def answer_request_file(*, scope, question: str, mode: str = "cartridge", actor=None) -> AnswerRequest:
    """Seal a question for a worker to answer (queue ``cartridge_answer_task`` with the returned row's id)."""
    question = question_validate(question)
    if mode not in MODES:
        raise MnesioError(f"`mode` has to be one of {MODES} but got {mode!r}", extra={"field": "mode"})
    key = crypto.new_data_key()
    with transaction.atomic():
        request = _request_create(scope=scope, mode=mode, actor=actor, key=key, question=question)
    return request


@sensitive_variables()
def _request_create(*, scope, mode: str, actor, key: bytes, question: str) -> AnswerRequest:
    request = AnswerRequest.objects.create(
        scope=scope,
        mode=mode,
        wrapped_key=b"",
        wrapped_by="",
        sealed_question=b"",
        actor=actor if getattr(actor, "is_authenticated", False) else None,
    )
    # the associated data names the row, so the key and the question are sealed once the id exists
    wrapped, wrapped_by = crypto.wrap(key, aad=_request_aad(request.pk, "key"))
    AnswerRequest.objects.filter(pk=request.pk).update(
        wrapped_key=wrapped,
        wrapped_by=wrapped_by,
        sealed_question=_seal(key, question.encode(), _request_aad(request.pk, "question")),
    )
    request.refresh_from_db()
    return request


@sensitive_variables()
def answer_request_answer(*, answer_request: AnswerRequest) -> AnswerRequest:
    """Answer a filed request and seal the result into it (what the worker task runs); safe to run twice."""
    request = AnswerRequest.objects.select_related("scope").get(pk=answer_request.pk)
    if request.answered_at is not None:
        return request
    key = _request_key(request)
    question = _open(key, request.sealed_question, _request_aad(request.pk, "question")).decode()
    try:
        result = cartridge_answer(scope=request.scope, question=question, mode=request.mode, actor=request.actor)
    except MnesioError as exc:
        AnswerRequest.objects.filter(pk=request.pk).update(error=exc.message[:1000], answered_at=timezone.now())
    else:
        sealed = _seal(key, json.dumps(result.as_dict()).encode(), _request_aad(request.pk, "answer"))
        AnswerRequest.objects.filter(pk=request.pk).update(sealed_answer=sealed, answered_at=timezone.now())
    request.refresh_from_db()
    return request


@sensitive_variables()
def answer_request_collect(*, answer_request: AnswerRequest) -> AnswerResult:
    """Open the answer of a request and delete the request with its key (a second collect is a 404-able error)."""
    request = AnswerRequest.objects.filter(pk=answer_request.pk).first()
    if request is None:
        raise MnesioError(f"`answer_request` {answer_request.pk} does not exist or was collected", extra={"field": "answer_request"}, status_code=404)
    if request.answered_at is None:
        raise Conflict(f"`answer_request` {request.pk} is not answered yet; try again shortly", extra={"field": "answer_request"})
    error = request.error
    payload = None
    if not error:
        payload = json.loads(_open(_request_key(request), request.sealed_answer, _request_aad(request.pk, "answer")))
    request.delete()
    if error:
        raise Conflict(error, extra={"field": "answer_request"})
    return AnswerResult(**payload)
