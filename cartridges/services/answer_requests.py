"""Questions filed for a worker (AnswerRequest): sealed under a key of their own, answered once, collected once.

A request's key is wrapped by the master key; its question, answer and streamed deltas are sealed with it under
associated data naming the row. ``cartridge_answer_task(answer_request_id)`` answers it on the gpu queue (a
task's arguments never hold the question); collecting opens the answer and deletes the row with its key; the
sweep deletes what nobody collected within MNESIO_ANSWER_REQUEST_TTL_S.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from core.errors import Conflict, MnesioError
from kvengine.conversation import Prompt
from memories import crypto

from .. import conf
from ..models import AnswerRequest
from .answer import AnswerResult, cartridge_answer, mode_validate, question_validate
from .ask import DEFAULT_OPTIONS, AskOptions, ask_open_payload, ask_seal_payload
from .stream import cartridge_answer_stream

log = logging.getLogger("cartridges")


def answer_request_aad(request_id: int, part: str) -> bytes:
    """Associated data of a request's wrapped key (``part="key"``), sealed question and sealed answer."""
    return f"mnesio:answer-request:v1|{request_id}|{part}".encode()


@sensitive_variables()
def answer_request_key(request: AnswerRequest) -> bytes:
    """The request's own data key, unwrapped (it seals the question, the answer and every streamed delta)."""
    return crypto.unwrap(bytes(request.wrapped_key), wrapped_by=request.wrapped_by, aad=answer_request_aad(request.pk, "key"))


@sensitive_variables()
def answer_request_file(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
                        options: AskOptions = DEFAULT_OPTIONS) -> AnswerRequest:
    """Seal a question (with its options) for a worker to answer (queue ``cartridge_answer_task`` with the row's id)."""
    payload = ask_seal_payload(question_validate(question), options)
    mode = mode_validate(mode)
    key = crypto.new_data_key()
    with transaction.atomic():
        request = _request_create(scope=scope, mode=mode, actor=actor, key=key, payload=payload)
    return request


@sensitive_variables()
def _request_create(*, scope, mode: str, actor, key: bytes, payload: bytes) -> AnswerRequest:
    request = AnswerRequest.objects.create(
        scope=scope,
        mode=mode,
        wrapped_key=b"",
        wrapped_by="",
        sealed_question=b"",
        actor=actor if getattr(actor, "is_authenticated", False) else None,
    )
    # the associated data names the row, so the key and the question are sealed once the id exists
    wrapped, wrapped_by = crypto.wrap(key, aad=answer_request_aad(request.pk, "key"))
    AnswerRequest.objects.filter(pk=request.pk).update(
        wrapped_key=wrapped,
        wrapped_by=wrapped_by,
        sealed_question=crypto.seal_box(key, payload, aad=answer_request_aad(request.pk, "question")),
    )
    request.refresh_from_db()
    return request


def answer_request_delta_aad(request_id: int, seq: int) -> bytes:
    """Associated data of the ``seq``-th streamed delta of a request (services.stream; the order is bound in)."""
    return answer_request_aad(request_id, f"delta:{seq}")


@sensitive_variables()
def answer_request_answer(
    *, answer_request: AnswerRequest, publish: Callable[[int, bytes], bool] | None = None
) -> AnswerRequest:
    """Answer a filed request and seal the result into it (what the worker task runs); safe to run twice.

    With ``publish`` (a streamed ask), each text delta is sealed with the request's own key and handed to
    ``publish(seq, sealed)`` as it is decoded; when ``publish`` returns False nobody listens any more (the
    asker went away), so decoding stops there and nothing is sealed.
    """
    request = AnswerRequest.objects.select_related("scope").filter(pk=answer_request.pk).first()
    if request is None:  # collected, swept, or discarded by an erasure meanwhile
        raise MnesioError(f"`answer_request` {answer_request.pk} does not exist (collected, expired or discarded)",
                          extra={"field": "answer_request"}, status_code=404)
    if request.answered_at is not None:
        return request
    key = answer_request_key(request)
    try:
        question, options = ask_open_payload(crypto.open_box(key, request.sealed_question, aad=answer_request_aad(request.pk, "question")))
        if publish is None:
            result = cartridge_answer(scope=request.scope, question=question, mode=request.mode, actor=request.actor,
                                      options=options)
        else:
            result = _answer_published(request=request, key=key, question=question, publish=publish, options=options)
            if result is None:  # the asker is gone (and has deleted the row): nothing to seal
                return request
    except MnesioError as exc:  # kept with its status and kind: collecting answers as the synchronous ask would
        AnswerRequest.objects.filter(pk=request.pk).update(
            error=exc.message[:1000], error_status=exc.status_code, error_kind=type(exc).__name__[:64],
            answered_at=timezone.now(),
        )
    else:
        sealed = crypto.seal_box(key, json.dumps(result.as_dict()).encode(), aad=answer_request_aad(request.pk, "answer"))
        AnswerRequest.objects.filter(pk=request.pk).update(sealed_answer=sealed, answered_at=timezone.now())
    # the asker may collect (and delete) the row the moment it is answered: then the row as it was is returned
    return AnswerRequest.objects.filter(pk=request.pk).first() or request


@sensitive_variables()
def _answer_published(*, request: AnswerRequest, key: bytes, question: Prompt,
                      publish: Callable[[int, bytes], bool], options: AskOptions) -> AnswerResult | None:
    """Stream the answer through ``publish`` (sealed deltas); the AnswerResult, or None when nobody listened."""
    stream = cartridge_answer_stream(scope=request.scope, question=question, mode=request.mode, actor=request.actor,
                                     options=options)
    result = None
    try:
        for seq, item in enumerate(stream):
            if isinstance(item, AnswerResult):
                result = item
            elif not publish(seq, crypto.seal_box(key, item.encode(), aad=answer_request_delta_aad(request.pk, seq))):
                log.info("answer request %s: the asker went away; decoding stopped", request.pk)
                return None
    finally:
        stream.close()
    return result


@sensitive_variables()
def answer_request_collect(*, answer_request: AnswerRequest) -> AnswerResult:
    """Open the answer of a request and delete the request with its key (a second collect is a 404-able error)."""
    request = AnswerRequest.objects.filter(pk=answer_request.pk).first()
    if request is None:
        raise MnesioError(f"`answer_request` {answer_request.pk} does not exist or was collected", extra={"field": "answer_request"}, status_code=404)
    ttl = conf.answer_request_ttl_s()
    if request.created_at <= timezone.now() - timedelta(seconds=ttl):
        request.delete()  # what the sweep would do: an expired answer is not handed out
        raise MnesioError(
            f"`answer_request` {request.pk} expired: it was not collected within {ttl} s (MNESIO_ANSWER_REQUEST_TTL_S)",
            extra={"field": "answer_request"}, status_code=404,
        )
    if request.answered_at is None:
        raise Conflict(f"`answer_request` {request.pk} is not answered yet; try again shortly", extra={"field": "answer_request"})
    error, error_status, error_kind = request.error, request.error_status, request.error_kind
    payload = None
    if not error:
        payload = json.loads(crypto.open_box(answer_request_key(request), request.sealed_answer, aad=answer_request_aad(request.pk, "answer")))
    request.delete()
    if error:
        raise MnesioError(error, extra={"field": "answer_request", "kind": error_kind or None},
                          status_code=error_status or Conflict.status_code)
    return AnswerResult(**payload)


def answer_requests_sweep(*, older_than_s: int) -> int:
    """Delete answer requests (with their keys) filed more than ``older_than_s`` ago; return how many.

    A request nobody collects would otherwise keep a sealed question and answer for ever, outliving an
    erasure of what the answer quoted and a rotation that retires the key. Celery beat runs it
    (``answer_requests_sweep_task``) with MNESIO_ANSWER_REQUEST_TTL_S.
    """
    if not isinstance(older_than_s, int) or isinstance(older_than_s, bool) or older_than_s < 0:
        raise MnesioError(f"`older_than_s` has to be a whole number of seconds >= 0 but got {older_than_s!r}",
                          extra={"field": "older_than_s"})
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    num, _ = AnswerRequest.objects.filter(created_at__lte=cutoff).delete()
    if num:
        log.info("swept %d answer request(s) never collected", num)
    return num
