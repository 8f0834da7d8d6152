"""The API's front door for questions: bounded per process, answered here or by gpu workers, at once,
streamed, or later.

Like ``cartridges.jobs`` this module may send tasks (services never do). Every ask first takes one of this
process's answer slots (services/admission.py), held until the answer is out. With
``MNESIO_WEB_LOADS_MODEL`` on, this process's engine answers; off (a model-free web tier), the question is
sealed as an AnswerRequest that a gpu worker answers over the request's Redis channel, within
``MNESIO_REMOTE_ANSWER_TIMEOUT_S``. ``"async": true`` files the request and returns it at once (202) for the
asker to collect once.

Design: docs/design/asking.md.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import replace

from core.errors import MnesioError
from core.jobs import job_dispatch
from kvengine.conversation import Prompt

from . import conf
from .channels import answer_channel, message_read, redis_client
from .models import AnswerRequest
from .services import (
    AnswerResult,
    answer_request_collect,
    answer_request_file,
    cartridge_answer,
    cartridge_answer_choices,
)
from .services.admission import answer_slot, answer_slot_acquire, answer_slot_release, async_ask_admit
from .services.answer_requests import answer_request_delta_aad, answer_request_key
from .services.ask import DEFAULT_OPTIONS, AskOptions
from .services.stream import AnswerStream, cartridge_answer_stream
from .tasks import cartridge_answer_task

log = logging.getLogger("cartridges")

POLL_S = 0.5  # how often a waiting web process also looks at the row (a lost "done" message costs this much)


class WorkerTimeout(MnesioError):
    """No gpu worker answered in time (none running, or all busy): 504 + Retry-After, the request is withdrawn."""

    status_code = 504

    def __init__(self, message: str, *, extra: dict, retry_after_s: int):
        super().__init__(message, extra=extra)
        self.retry_after_s = retry_after_s  # core.errors sends it as Retry-After


def answer_ask(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
               options: AskOptions = DEFAULT_OPTIONS) -> AnswerResult:
    """Answer now (holding a slot): with this process's engine, or a gpu worker's when the web is model-free.

    ``question``: a string or a kvengine Conversation; ``options``: decoding and length (services/ask.py)."""
    with answer_slot():
        if conf.web_loads_model():
            return cartridge_answer(scope=scope, question=question, mode=mode, actor=actor, options=options)
        return _remote_answer(scope=scope, question=question, mode=mode, actor=actor, options=options)


def answer_ask_choices(*, scope, question: Prompt, num_choices: int, actor=None,
                       options: AskOptions = DEFAULT_OPTIONS) -> list[AnswerResult]:
    """``num_choices`` answers of one question in mode "cartridge", holding one slot: with this process's engine, decoded
    together (services.cartridge_answer_choices); on a model-free web tier, one worker request per choice (choice i
    with seed + i), one after another."""
    with answer_slot():
        if conf.web_loads_model():
            return cartridge_answer_choices(scope=scope, question=question, num_choices=num_choices, actor=actor,
                                            options=options)
        if options.decoding.temperature <= 0:  # greedy: one decode is every choice
            return [_remote_answer(scope=scope, question=question, mode="cartridge", actor=actor, options=options)] * num_choices
        return [_remote_answer(scope=scope, question=question, mode="cartridge", actor=actor,
                               options=replace(options, decoding=options.decoding.for_choice(i))) for i in range(num_choices)]


def answer_ask_stream(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
                      options: AskOptions = DEFAULT_OPTIONS) -> AnswerStream:
    """Open a streamed answer (holding a slot until it ends or is closed); see the module docstring for where."""
    answer_slot_acquire()
    try:
        if conf.web_loads_model():
            stream = cartridge_answer_stream(scope=scope, question=question, mode=mode, actor=actor, options=options)
            items: Iterator = stream
        else:
            items = _remote_stream(scope=scope, question=question, mode=mode, actor=actor, options=options)
    except BaseException:
        answer_slot_release()
        raise
    return AnswerStream(items, release=answer_slot_release)


def answer_ask_async(*, scope, question: Prompt, mode: str = "cartridge", actor=None,
                     options: AskOptions = DEFAULT_OPTIONS) -> AnswerRequest:
    """File the question for a gpu worker and return the request (collect it once with answer_request_collect_for);
    429 past the async bounds (services/admission.py)."""
    request = async_ask_admit(user=actor, file=lambda: answer_request_file(scope=scope, question=question, mode=mode,
                                                                           actor=actor, options=options))
    job_dispatch(cartridge_answer_task, args=[request.pk], robust=True)  # a broker down: the row waits, then expires
    return request


def answer_request_for(*, scope, pk: int, user) -> AnswerRequest:
    """The request ``pk`` filed in ``scope`` by ``user``, or a 404 that does not say whether it exists elsewhere."""
    request = AnswerRequest.objects.filter(pk=pk, scope=scope, actor_id=getattr(user, "pk", None)).first()
    if request is None:
        raise MnesioError(f"`answer_request` {pk} does not exist in scope '{scope.name}' for this user, or was "
                          "already collected (an answer is handed out once)",
                          extra={"field": "answer_request"}, status_code=404)
    return request


def answer_request_collect_for(*, scope, pk: int, user) -> AnswerResult | None:
    """Collect request ``pk`` (scope and user checked): the AnswerResult once, None while it is pending."""
    request = answer_request_for(scope=scope, pk=pk, user=user)
    if request.answered_at is None:
        if request.created_at is not None and _expired(request):
            return answer_request_collect(answer_request=request)  # raises the expiry (404) and deletes it
        return None
    return answer_request_collect(answer_request=request)


def _expired(request: AnswerRequest) -> bool:
    from datetime import timedelta

    from django.utils import timezone

    return request.created_at <= timezone.now() - timedelta(seconds=conf.answer_request_ttl_s())


# ---------------------------------------------------------------------------
# The model-free web tier: a gpu worker answers, this process waits on the request's channel.
# ---------------------------------------------------------------------------
def _subscribe(request_id: int):
    client = redis_client()
    if client is None:
        return None, None
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(answer_channel(request_id))
    return client, pubsub


def _close(client, pubsub) -> None:
    if pubsub is not None:
        pubsub.close()
    if client is not None:
        client.close()


def _answered(request_id: int) -> bool:
    return AnswerRequest.objects.filter(pk=request_id, answered_at__isnull=False).exists()


def _withdraw(request_id: int) -> None:
    """Delete a request nobody will collect (timed out, or its asker left), with its key."""
    AnswerRequest.objects.filter(pk=request_id).delete()


def _timeout(request_id: int, waited_s: float) -> WorkerTimeout:
    _withdraw(request_id)
    retry_after = conf.ask_retry_after_s()
    return WorkerTimeout(
        f"no gpu worker answered within {waited_s:.0f} s (MNESIO_REMOTE_ANSWER_TIMEOUT_S); the question was "
        "withdrawn: ask again, and check that workers consume the `gpu` queue",
        extra={"kind": "worker_timeout", "retry_after_s": retry_after}, retry_after_s=retry_after,
    )


def _messages(pubsub, request_id: int) -> Iterator[dict]:
    """Messages of the request's channel until "done" (also when the row shows answered); 504 past the timeout."""
    limit = conf.remote_answer_timeout_s()
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        if waited >= limit:
            raise _timeout(request_id, waited)
        if pubsub is None:  # no Redis: the row is all there is
            if _answered(request_id):
                return
            time.sleep(min(POLL_S, limit - waited))
            continue
        message = pubsub.get_message(timeout=min(POLL_S, limit - waited))
        if message is None:
            if _answered(request_id):  # a "done" lost (or published before we listened): the row says so
                yield from _drain(pubsub)
                return
            continue
        body = message_read(message.get("data"))
        if body.get("done"):
            return
        if body:
            yield body


def _drain(pubsub) -> Iterator[dict]:
    while (message := pubsub.get_message(timeout=0)) is not None:
        body = message_read(message.get("data"))
        if body and not body.get("done"):
            yield body


def _remote_answer(*, scope, question: Prompt, mode: str, actor, options: AskOptions) -> AnswerResult:
    request = answer_request_file(scope=scope, question=question, mode=mode, actor=actor, options=options)
    client, pubsub = _subscribe(request.pk)
    try:
        job_dispatch(cartridge_answer_task, args=[request.pk], robust=True)
        for _ in _messages(pubsub, request.pk):
            pass
    finally:
        _close(client, pubsub)
    return answer_request_collect(answer_request=request)


def _remote_stream(*, scope, question: Prompt, mode: str, actor, options: AskOptions) -> Iterator[str | AnswerResult]:
    """File, subscribe, send; the generator yields the opened deltas, then the collected AnswerResult."""
    request = answer_request_file(scope=scope, question=question, mode=mode, actor=actor, options=options)
    key = answer_request_key(request)
    client, pubsub = _subscribe(request.pk)
    try:
        job_dispatch(cartridge_answer_task, args=[request.pk, True], robust=True)
    except BaseException:
        _close(client, pubsub)
        _withdraw(request.pk)
        raise
    state = {"collected": False}

    def clean_up() -> None:  # also when the stream is closed before its first item (its generator never ran)
        _close(client, pubsub)
        if not state["collected"]:  # the client left (or it failed): nobody will collect; the worker's publishes stop
            _withdraw(request.pk)

    return AnswerStream(_remote_deltas(request, key, pubsub, state), on_close=clean_up)


def _remote_deltas(request: AnswerRequest, key: bytes, pubsub, state: dict) -> Iterator[str | AnswerResult]:
    from memories import crypto

    next_seq = 0
    for body in _messages(pubsub, request.pk):
        if body["seq"] < next_seq:  # a redelivered task publishes again from 0: skip what was passed on
            continue
        next_seq = body["seq"] + 1
        yield crypto.open_box(key, body["sealed"], aad=answer_request_delta_aad(request.pk, body["seq"])).decode()
    state["collected"] = True
    yield answer_request_collect(answer_request=request)
