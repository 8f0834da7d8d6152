"""An OpenAI-compatible surface, mounted at /v1/: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` and ``GET /v1/models/<id>``.

Any OpenAI client can ask a scope's cartridge: ``model`` is the scope's name, the API token is sent as
``Authorization: Bearer``, ``messages`` are a conversation after the memories (system text folded into the
first user turn). Parameters are read by openai_params.py (greedy by default; what mnesio does not support
is refused by name). Errors have OpenAI's shape on every /v1/ path; asks go through cartridges.asking, the
same front door as /api/.

Design (messages, parameters, usage, streaming, errors): docs/design/openai-compat.md.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import error_code
from core.errors import exception_handler as mnesio_exception_handler
from memories.selectors import scope_get_for_user, user_scopes

from .. import asking
from ..services import AnswerResult
from . import openai_params as params
from .openai_params import InvalidRequest
from .sse import Encoder, error_body, sse, streaming_response

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "invalid_request_error", 422: "invalid_request_error",
               429: "rate_limit_error"}


def bearer_authentication() -> Any:
    """The project's token authentication (REST_FRAMEWORK's knox class), reading ``Authorization: Bearer <token>``.

    Built from the configured class rather than imported: the apps never import the project package.
    """
    from knox.auth import TokenAuthentication as KnoxTokenAuthentication
    from rest_framework.settings import api_settings

    base = next(c for c in api_settings.DEFAULT_AUTHENTICATION_CLASSES if issubclass(c, KnoxTokenAuthentication))
    bearer = type("BearerTokenAuthentication", (base,), {"authenticate_header": lambda self, request: "Bearer"})
    return bearer()


def openai_error(status_code: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body."""
    kind = ERROR_TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_code(body: dict[str, Any], *, status_code: int) -> str | None:
    """The OpenAI ``code`` of a rendered /api/-shaped error body: an OpenAI code the error names (``extra.code``:
    ``unsupported``, ``invalid_value``, ...), else the stable code the project's handler gave it (core.errors:
    ``no_active_cartridge``, ``overloaded``, ...), a scope being a model here (404 ``model_not_found``)."""
    extra = body.get("extra") if isinstance(body.get("extra"), dict) else {}
    if extra.get("field") == "scope" and status_code == 404:
        return "model_not_found"
    for code in (extra.get("code"), body.get("code"), extra.get("kind")):
        if isinstance(code, str):
            return code
    return None


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's handler (same statuses, Retry-After), its body reshaped as OpenAI's error."""
    response = mnesio_exception_handler(exc, context)
    if response is None:
        return None
    body = response.data if isinstance(response.data, dict) else {}
    extra = body.get("extra") if isinstance(body.get("extra"), dict) else {}
    param = extra.get("field")
    code = openai_code(body, status_code=response.status_code)
    if isinstance(exc, APIException):
        code = exc.default_code
        if isinstance(exc, ParseError):
            param, code = "body", "invalid_json"
    if param == "scope":  # a scope is a model here
        param = "model"
    response.data = openai_error(response.status_code, str(body.get("message", "error")), param=param, code=code)
    return response


class OpenAIView(APIView):
    permission_classes = [permissions.IsAuthenticated]

    def get_authenticators(self) -> list[Any]:
        return [bearer_authentication()]

    def get_exception_handler(self):
        return openai_exception_handler


def _body(request: Request) -> dict[str, Any]:
    try:
        data = request.data
    except ParseError as exc:
        raise InvalidRequest(f"the body has to be a JSON object: {exc.detail}", param=None, code="invalid_json") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"the body has to be a JSON object but got {type(data).__name__}", param=None)
    return data


def usage(result: AnswerResult, *more: AnswerResult) -> dict[str, Any]:
    """OpenAI's usage of an answer (and more choices of it): the cartridge's tokens are the cached part of the prompt."""
    prompt = result.num_context_tokens + result.num_prompt_tokens
    completion = result.num_answer_tokens + sum(r.num_answer_tokens for r in more)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": result.num_context_tokens}}


def _finish_reason(result: AnswerResult) -> str:
    return result.finish_reason or "stop"


def _chat_logprobs(result: AnswerResult) -> dict[str, Any]:
    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {"content": [{**entry(e["token"], e["logprob"]), "top_logprobs": [entry(t, lp) for t, lp in e["top"]]}
                        for e in result.logprobs], "refusal": None}


def _completion_logprobs(result: AnswerResult) -> dict[str, Any]:
    offsets, at = [], 0
    for e in result.logprobs:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in result.logprobs], "token_logprobs": [e["logprob"] for e in result.logprobs],
            "top_logprobs": [dict(e["top"]) for e in result.logprobs], "text_offset": offsets}


def _mnesio(result: AnswerResult) -> dict[str, Any]:
    """What /api/ also says (an extra field; OpenAI clients keep it on the object)."""
    return {"version_id": result.version_id, "ttft_s": result.ttft_s, "total_s": result.total_s,
            "num_memories_after_version": result.num_memories_after_version, "num_memories_unread": result.num_memories_unread}


class ChunkEncoder(Encoder):
    """OpenAI's ``chat.completion.chunk`` events, ``data: [DONE]`` at the end, whitespace held as documented."""

    object = "chat.completion.chunk"

    def __init__(self, *, model: str, include_usage: bool):
        self.id = f"{'chatcmpl' if self.object.startswith('chat') else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.begun = False
        self.held = ""

    def _choice(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"delta": delta}

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, **self._choice(delta), "logprobs": None, "finish_reason": finish_reason}
        return sse(None, {"id": self.id, "object": self.object, "created": self.created,
                          "model": self.model, "system_fingerprint": None, "choices": [choice], **more})

    def start(self):
        yield self._chunk({"role": "assistant", "content": ""})

    def delta(self, text: str) -> bytes:
        if not self.begun:
            text = text.lstrip()
            if not text:
                return b""
            self.begun = True
        text = self.held + text
        shown = text.rstrip()
        self.held = text[len(shown):]
        return self._chunk({"content": shown}) if shown else b""

    def done(self, result: AnswerResult) -> bytes:
        out = self._chunk({}, _finish_reason(result), mnesio=_mnesio(result))
        if self.include_usage:
            out += sse(None, {"id": self.id, "object": self.object, "created": self.created,
                              "model": self.model, "system_fingerprint": None, "choices": [], "usage": usage(result)})
        return out

    def error(self, exc: BaseException) -> bytes:
        status_code, body = error_body(exc)
        extra = body.get("extra") or {}
        body = {"code": error_code(exc, status_code=status_code, kind=extra.get("kind")), **body}
        param = "model" if extra.get("field") == "scope" else extra.get("field")
        return sse(None, openai_error(status_code, body["message"], param=param,
                                      code=openai_code(body, status_code=status_code)))

    def end(self):
        yield b"data: [DONE]\n\n"


class CompletionChunkEncoder(ChunkEncoder):
    """``text_completion`` chunks: the text in ``choices[0].text``, no role chunk."""

    object = "text_completion"

    def _choice(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"text": delta.get("content", "")}

    def start(self):
        yield from ()


def _answers(ask: dict[str, Any], parsed: params.Parsed) -> list[AnswerResult]:
    """The ``n`` choices, all on the one cartridge prefix (computed once, at compile).

    Greedy (temperature 0 or absent): decoded once, and that answer is every choice. This is exact, not a
    shortcut: greedy decoding takes the argmax at each step (also under a JSON schema, which only masks tokens,
    and with log-probs, which only report), so the answer is a function of the cartridge, the prompt, the length
    and the stops, and n decodes of one request are n copies of the same tokens (the batched and lone paths
    agree to float rounding, tests/kvengine/test_batching.py, noise and not a distribution to draw from); no
    seed or top_p changes an argmax.

    Sampled: each choice is its own draw, with its own seed (seed + i) when one was given, so choice i is the answer
    of one request with seed + i. The question is computed once on top of the cartridge and the n choices are
    decoded together as a batch of rows over that shared prefix, each with its own sampler, stops and length
    (asking.answer_ask_choices, kvengine/choices.py), holding one of this process's answer slots.
    """
    if parsed.options.decoding.temperature <= 0:
        return [asking.answer_ask(**ask, options=parsed.options)] * parsed.n
    return asking.answer_ask_choices(scope=ask["scope"], question=ask["question"], actor=ask["actor"],
                                     num_choices=parsed.n, options=parsed.options)


def _respond(request: Request, data: dict[str, Any], *, chat: bool) -> Any:
    parsed = params.parse(data, chat=chat)
    question = params.prompt(data.get("messages")) if chat else params.completion_prompt(data.get("prompt"))
    scope = scope_get_for_user(user=request.user, name=parsed.model)
    ask = {"scope": scope, "question": question, "mode": "cartridge", "actor": request.user}
    if parsed.stream:
        kind = ChunkEncoder if chat else CompletionChunkEncoder
        encoder = kind(model=scope.name, include_usage=parsed.include_usage)
        return streaming_response(request, asking.answer_ask_stream(**ask, options=parsed.options), encoder)
    results = _answers(ask, parsed)
    logprobs = parsed.options.decoding.logprobs
    if chat:
        choices = [{"index": i, "message": {"role": "assistant", "content": r.answer, "refusal": None},
                    "logprobs": _chat_logprobs(r) if logprobs else None, "finish_reason": _finish_reason(r)}
                   for i, r in enumerate(results)]
    else:
        choices = [{"index": i, "text": r.answer, "logprobs": _completion_logprobs(r) if logprobs else None,
                    "finish_reason": _finish_reason(r)} for i, r in enumerate(results)]
    return Response({
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": scope.name, "system_fingerprint": None, "choices": choices,
        "usage": usage(*results), "mnesio": _mnesio(results[0]),
    })


class ChatCompletionsView(OpenAIView):
    @extend_schema(exclude=True)  # OpenAI's own API reference documents this shape
    def post(self, request: Request) -> Any:
        return _respond(request, _body(request), chat=True)


class CompletionsView(OpenAIView):
    @extend_schema(exclude=True)
    def post(self, request: Request) -> Any:
        return _respond(request, _body(request), chat=False)


def _model(scope) -> dict[str, Any]:
    return {"id": scope.name, "object": "model", "created": int(scope.created_at.timestamp()), "owned_by": "mnesio"}


class ModelView(OpenAIView):
    @extend_schema(exclude=True)
    def get(self, request: Request, model: str) -> Response:
        return Response(_model(scope_get_for_user(user=request.user, name=model)))


class ModelListView(OpenAIView):
    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        data = [_model(scope) for scope in user_scopes(user=request.user)]
        return Response({"object": "list", "data": data})


@csrf_exempt  # a POST to an unknown path is a JSON 404 like a GET, not the CSRF middleware's HTML 403
def not_found(request: Any, exception: Exception | None = None) -> JsonResponse:
    """Any other /v1/ path, whatever the method: OpenAI's 404 shape."""
    return JsonResponse(openai_error(status.HTTP_404_NOT_FOUND, f"no route {request.path}", code="unknown_url"),
                        status=status.HTTP_404_NOT_FOUND)
