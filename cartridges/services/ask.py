"""What an ask carries besides the scope: the question or a conversation, and how to decode the answer.

A question is a string or a kvengine Conversation (the client's system text and earlier turns; the memories stay
the cached prefix, kvengine/layout.py). AskOptions holds the decoding (kvengine/decoding.py; greedy by default)
and the answer length (at most the server's MNESIO_ANSWER_MAX_NEW_TOKENS). For a gpu worker both are sealed
together as one JSON document behind a prefix byte (``ask_seal_payload``), whatever the question: a question's own
text is never read as options (a question that was such a document, sealed as bare text, made the worker fail).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.conf import settings

from core.errors import MnesioError
from kvengine.conversation import ROLES, Conversation, Prompt, Turn
from kvengine.decoding import GREEDY, Decoding

from .. import conf

MAX_TURNS = 64  # turns of one conversation (each at most MNESIO_MAX_QUESTION_CHARS)
_PAYLOAD_KIND = "mnesio-ask-v1"
# Starts every payload sealed now. Never in UTF-8, so never the first byte of one sealed before it (a question's
# bare text, or the JSON document): those are opened as they were, until they expire (MNESIO_ANSWER_REQUEST_TTL_S).
_PAYLOAD_PREFIX = b"\xff"


@dataclass(frozen=True)
class AskOptions:
    """How to answer: the decoding and the answer length (None: the server's)."""

    decoding: Decoding = field(default=GREEDY)
    max_new_tokens: int | None = None

    def length(self) -> int:
        """The answer's token budget: the asked length, never over the server's."""
        cap = conf.answer_max_new_tokens()
        return cap if self.max_new_tokens is None else min(self.max_new_tokens, cap)

    def engine_kwargs(self) -> dict[str, Decoding]:
        """The decoding to hand the engine: none for the default, so the call is the one every backend (and every
        stand-in a test puts in its place) has always taken."""
        return {} if self.decoding == GREEDY else {"decoding": self.decoding}


DEFAULT_OPTIONS = AskOptions()


def _checked_text(value: object, field_name: str) -> str:
    limit = int(settings.MNESIO_MAX_QUESTION_CHARS)
    if not isinstance(value, str) or not value.strip():
        raise MnesioError(f"`{field_name}` has to be non-empty text", extra={"field": field_name})
    if len(value) > limit:
        raise MnesioError(f"`{field_name}` has to be at most {limit} characters but got {len(value)}", extra={"field": field_name})
    return value.strip()


def prompt_validate(question: object) -> Prompt:
    """The question stripped, or the conversation with every turn checked; raise naming the field."""
    if not isinstance(question, Conversation):
        return _checked_text(question, "question")
    if len(question.turns) > MAX_TURNS:
        raise MnesioError(f"`history` has to hold at most {MAX_TURNS - 1} turns but got {len(question.turns) - 1}",
                          extra={"field": "history"})
    for i, turn in enumerate(question.turns[:-1]):
        _checked_text(turn.content, f"history[{i}].content")
    _checked_text(question.question, "question")
    if question.system:
        _checked_text(question.system, "system")
    return question


def prompt_build(*, question: str, history: list[tuple[str, str]] = (), system: str = "",
                 history_field: str = "history") -> Prompt:
    """The plain question, or the conversation of ``history`` ((role, content) pairs, roles user/assistant, the
    first a user's) and ``question`` after it, with the client's ``system`` text; raise naming the field."""
    if not history and not system:
        return question
    for i, (role, _) in enumerate(history):
        if role not in ROLES:
            raise MnesioError(f"`{history_field}[{i}].role` has to be one of {list(ROLES)} but got {role!r}",
                              extra={"field": f"{history_field}[{i}].role"})
    if history and history[0][0] != "user":
        raise MnesioError(f"`{history_field}[0].role` has to be 'user': a conversation after the memories begins with a "
                          "user turn (the client's system text goes into it)", extra={"field": f"{history_field}[0].role"})
    turns = (*(Turn(role, content) for role, content in history), Turn("user", question))
    return prompt_validate(Conversation(turns=turns, system=system or ""))


def ask_seal_payload(question: Prompt, options: AskOptions) -> bytes:
    """The bytes sealed for a worker: the prefix byte, then one JSON document of the question and the options."""
    body = {"kind": _PAYLOAD_KIND, "max_new_tokens": options.max_new_tokens, "decoding": options.decoding.as_dict(),
            "question": question.as_dict() if isinstance(question, Conversation) else question}
    return _PAYLOAD_PREFIX + json.dumps(body).encode()


def _payload_of(body: dict) -> tuple[Prompt, AskOptions]:
    question = body["question"]
    prompt = Conversation.of_dict(question) if isinstance(question, dict) else question
    if not isinstance(prompt, (str, Conversation)):
        raise TypeError(f"a payload's question is text or a conversation, not {type(prompt).__name__}")
    return prompt, AskOptions(decoding=Decoding.of_dict(body["decoding"]), max_new_tokens=body["max_new_tokens"])


def ask_open_payload(data: bytes) -> tuple[Prompt, AskOptions]:
    """What ask_seal_payload sealed (or, without the prefix, what it sealed before: a question's text or the document).

    Raises MnesioError (never another error) for a prefixed payload that does not open, so the worker records it as
    the request's answer and the asker is told rather than left waiting.
    """
    if data.startswith(_PAYLOAD_PREFIX):
        try:
            return _payload_of(json.loads(data[len(_PAYLOAD_PREFIX):].decode()))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise MnesioError(f"the sealed question does not open: {type(exc).__name__}", extra={"field": "question"},
                              status_code=500) from None
    text = data.decode()
    if text.startswith("{"):
        try:
            body = json.loads(text)
            if isinstance(body, dict) and body.get("kind") == _PAYLOAD_KIND:
                return _payload_of(body)
        except (ValueError, TypeError, KeyError, AttributeError):
            pass  # not a document this sealed: a question's text that looked like one
    return text, DEFAULT_OPTIONS
