"""An OpenAI-compatible surface, mounted at /v1/: ``POST /v1/chat/completions`` and ``GET /v1/models``.

So any OpenAI client (the official ``openai`` package, LangChain, curl scripts) can ask a scope's cartridge.

Decisions:
- Authentication: the same API tokens as /api/ (django-rest-knox, stored hashed), sent the OpenAI way:
  ``Authorization: Bearer <token>`` (the client's ``api_key``).
- ``model`` is the scope's name; ``GET /v1/models`` lists the scopes the token's user is granted. A scope
  the user is not granted is as unknown as one that does not exist (404, ``model_not_found``).
- ``messages``: the last message has to be the user's, and it is the question; earlier messages are not
  read (the scope's memories, compiled into its cartridge, are the context). Content is a string or a list
  of ``{"type": "text", "text": ...}`` parts.
- Decoding is greedy and its length is the server's (MNESIO_ANSWER_MAX_NEW_TOKENS): ``temperature`` is
  accepted only as 0 (or absent), ``top_p`` only as 1, ``n`` only as 1, and ``max_tokens`` /
  ``max_completion_tokens`` only at least the server's length (an answer is never longer; a smaller cap
  would silently give a different answer than the same question on /api/, so it is refused by name).
  ``stream``, ``stream_options.include_usage`` and ``user`` (ignored, never logged) are accepted; any other
  parameter is refused with 400 naming it (``unknown_parameter``), as OpenAI does.
- ``usage``: ``prompt_tokens`` = cartridge tokens + the tokens run for the question, of which
  ``prompt_tokens_details.cached_tokens`` = the cartridge's (computed once, at compile); ``completion_tokens``
  = tokens generated. ``finish_reason`` is "length" when the answer reached the server's length, else "stop".
- Streamed text equals the non-streamed text: leading whitespace of the first delta and trailing whitespace
  of the last are held back (the non-streamed answer is stripped).
- Errors are OpenAI's shape ``{"error": {"message", "type", "param", "code"}}`` with the status the same
  failure has on /api/ (429 + Retry-After when the process is full; a failure after the first chunk is a
  ``data: {"error": ...}`` chunk, which the official client raises as an APIError).
- Asks go through the same front door as /api/ (cartridges.asking): the per-process bound, the model-free
  web tier and the AnswerRecord are the same.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from django.http import JsonResponse
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.errors import MnesioError
from core.errors import exception_handler as mnesio_exception_handler
from memories.selectors import scope_get_for_user, user_scopes

from .. import asking, conf
from ..services import AnswerResult
from .sse import Encoder, error_body, sse, streaming_response

ACCEPTED = ("model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens", "temperature",
            "top_p", "n", "user")
ROLES = ("system", "developer", "user", "assistant", "tool")
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


class InvalidRequest(MnesioError):
    """A request OpenAI's API would refuse too: 400 naming ``param`` (and an OpenAI ``code``)."""

    def __init__(self, message: str, *, param: str | None, code: str | None = None, status_code: int = 400):
        super().__init__(message, extra={"field": param, "code": code}, status_code=status_code)


def openai_error(status_code: int, message: str, *, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body."""
    kind = ERROR_TYPES.get(status_code, "server_error" if status_code >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The project's handler (same statuses, Retry-After), its body reshaped as OpenAI's error."""
    response = mnesio_exception_handler(exc, context)
    if response is None:
        return None
    body = response.data if isinstance(response.data, dict) else {}
    extra = body.get("extra") or {}
    param = extra.get("field") if isinstance(extra, dict) else None
    code = extra.get("code") if isinstance(extra, dict) else None
    if isinstance(exc, APIException):
        code = exc.default_code
        if isinstance(exc, ParseError):
            param, code = "body", "invalid_json"
    elif isinstance(extra, dict) and not isinstance(code, str):
        code = extra.get("kind") if isinstance(extra.get("kind"), str) else None
    if param == "scope":  # a scope is a model here
        param, code = "model", ("model_not_found" if response.status_code == 404 else code)
    response.data = openai_error(response.status_code, str(body.get("message", "error")), param=param,
                                 code=code if isinstance(code, str) else None)
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


def _question(messages: object) -> str:
    """The last message's text, which has to be the user's."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("`messages` has to be a non-empty list of {role, content} objects", param="messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise InvalidRequest(f"`messages[{i}]` has to be an object whose `role` is one of {list(ROLES)}",
                                 param=f"messages[{i}]")
    last = messages[-1]
    if last["role"] != "user":
        raise InvalidRequest(f"the last message has to be the user's question but its role is '{last['role']}'",
                             param=f"messages[{len(messages) - 1}].role")
    content = last.get("content")
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
            raise InvalidRequest("the user message's content parts have to be {\"type\": \"text\", \"text\": ...}",
                                 param=f"messages[{len(messages) - 1}].content")
        content = "\n".join(parts)
    if not isinstance(content, str) or not content.strip():
        raise InvalidRequest("the user message's `content` has to be non-empty text",
                             param=f"messages[{len(messages) - 1}].content")
    return content


def _options(data: dict[str, Any]) -> dict[str, Any]:
    """Check every parameter (unknown ones refused by name); return {stream, include_usage}."""
    for name in data:
        if name not in ACCEPTED:
            raise InvalidRequest(f"Unrecognized request argument supplied: {name} (accepted: {list(ACCEPTED)})",
                                 param=name, code="unknown_parameter")
    if not isinstance(data.get("model"), str) or not data["model"]:
        raise InvalidRequest("`model` has to be the name of a scope (GET /v1/models lists yours)", param="model")
    stream = data.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequest(f"`stream` has to be true or false but got {stream!r}", param="stream")
    include_usage = False
    if data.get("stream_options") is not None:
        options = data["stream_options"]
        if not stream or not isinstance(options, dict) or set(options) - {"include_usage"} \
                or not isinstance(options.get("include_usage", False), bool):
            raise InvalidRequest("`stream_options` has to be {\"include_usage\": true|false}, with stream true",
                                 param="stream_options")
        include_usage = options.get("include_usage", False)
    for name, only in (("temperature", 0), ("top_p", 1), ("n", 1)):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value != only):
            raise InvalidRequest(f"`{name}` can only be {only} here (decoding is greedy) but got {value!r}",
                                 param=name, code="unsupported_value")
    length = conf.answer_max_new_tokens()
    for name in ("max_tokens", "max_completion_tokens"):
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < length):
            raise InvalidRequest(f"`{name}` has to be a whole number >= {length} (this server's answer length, "
                                 f"MNESIO_ANSWER_MAX_NEW_TOKENS; answers are never longer) but got {value!r}",
                                 param=name, code="unsupported_value")
    if data.get("user") is not None and not isinstance(data["user"], str):
        raise InvalidRequest("`user` has to be a string", param="user")
    return {"stream": bool(stream), "include_usage": include_usage}


def usage(result: AnswerResult) -> dict[str, Any]:
    """OpenAI's usage of an answer: the cartridge's tokens are the cached part of the prompt."""
    prompt = result.num_context_tokens + result.num_prompt_tokens
    return {"prompt_tokens": prompt, "completion_tokens": result.num_answer_tokens,
            "total_tokens": prompt + result.num_answer_tokens,
            "prompt_tokens_details": {"cached_tokens": result.num_context_tokens}}


def _finish_reason(result: AnswerResult) -> str:
    return "length" if result.num_answer_tokens >= conf.answer_max_new_tokens() else "stop"


def _mnesio(result: AnswerResult) -> dict[str, Any]:
    """What /api/ also says (an extra field; OpenAI clients keep it on the object)."""
    return {"version_id": result.version_id, "ttft_s": result.ttft_s, "total_s": result.total_s}


class ChunkEncoder(Encoder):
    """OpenAI's ``chat.completion.chunk`` events, ``data: [DONE]`` at the end, whitespace held as documented."""

    def __init__(self, *, model: str, include_usage: bool):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.begun = False
        self.held = ""

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse(None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
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
            out += sse(None, {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                              "model": self.model, "system_fingerprint": None, "choices": [], "usage": usage(result)})
        return out

    def error(self, exc: BaseException) -> bytes:
        status_code, body = error_body(exc)
        extra = body.get("extra") or {}
        return sse(None, openai_error(status_code, body["message"], param=extra.get("field"), code=extra.get("kind")))

    def end(self):
        yield b"data: [DONE]\n\n"


class ChatCompletionsView(OpenAIView):
    @extend_schema(exclude=True)  # OpenAI's own API reference documents this shape
    def post(self, request: Request) -> Any:
        data = _body(request)
        options = _options(data)
        question = _question(data.get("messages"))
        scope = scope_get_for_user(user=request.user, name=data["model"])
        ask = {"scope": scope, "question": question, "mode": "cartridge", "actor": request.user}
        if options["stream"]:
            encoder = ChunkEncoder(model=scope.name, include_usage=options["include_usage"])
            return streaming_response(request, asking.answer_ask_stream(**ask), encoder)
        result = asking.answer_ask(**ask)
        return Response({
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": scope.name, "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": result.answer, "refusal": None},
                         "logprobs": None, "finish_reason": _finish_reason(result)}],
            "usage": usage(result), "mnesio": _mnesio(result),
        })


class ModelListView(OpenAIView):
    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        data = [{"id": scope.name, "object": "model", "created": int(scope.created_at.timestamp()), "owned_by": "mnesio"}
                for scope in user_scopes(user=request.user)]
        return Response({"object": "list", "data": data})


def not_found(request: Any, exception: Exception | None = None) -> JsonResponse:
    """Any other /v1/ path: OpenAI's 404 shape."""
    return JsonResponse(openai_error(status.HTTP_404_NOT_FOUND, f"no route {request.path}", code="unknown_url"),
                        status=status.HTTP_404_NOT_FOUND)
