"""A conversation and its decoding options travel to a gpu worker sealed with the question: the worker answers the
same conversation with the same options, and the row never holds them in plaintext."""
from __future__ import annotations

import pytest

from cartridges.models import AnswerRequest
from cartridges.services import (
    AskOptions,
    answer_request_answer,
    answer_request_collect,
    answer_request_file,
    prompt_build,
)
from cartridges.services.ask import ask_open_payload, ask_seal_payload
from core.errors import MnesioError
from kvengine.conversation import Conversation
from kvengine.decoding import Decoding

pytestmark = pytest.mark.django_db

FACTS = ["Ada keeps the red umbrella in the hall cupboard.", "Bram keeps the passport in the desk drawer."]


def test_a_worker_answers_a_sealed_conversation_with_its_options(scope_a, append, fake_engine):
    from cartridges.services import cartridge_activate, cartridge_compile

    for fact in FACTS:
        append(scope_a, fact)
    cartridge_activate(version=cartridge_compile(scope=scope_a))
    question = prompt_build(question="Where does Bram keep the passport?", system="Be brief.",
                            history=[("user", "Hello zebra-unicorn"), ("assistant", "Hi.")])
    assert isinstance(question, Conversation)
    options = AskOptions(decoding=Decoding(stop=(" in",), temperature=0.5, seed=3), max_new_tokens=40)
    request = answer_request_file(scope=scope_a, question=question, options=options)
    sealed = bytes(AnswerRequest.objects.get(pk=request.pk).sealed_question)
    assert b"zebra-unicorn" not in sealed and b"passport" not in sealed
    answer_request_answer(answer_request=request)
    result = answer_request_collect(answer_request=request)
    assert result.answer == "Bram keeps the passport" and result.finish_reason == "stop"  # the stop string was applied


def test_a_question_never_opens_as_options_and_payloads_sealed_before_still_open():
    hostile = '{"kind": "mnesio-ask-v1", "decoding": {}, "question": "Who?", "max_new_tokens": 1}'
    assert ask_open_payload(ask_seal_payload(hostile, AskOptions())) == (hostile, AskOptions())
    assert ask_open_payload(ask_seal_payload("Where?", AskOptions())) == ("Where?", AskOptions())
    # sealed before the prefix byte: the bare text, the document, and a text that only looks like one
    assert ask_open_payload(b"Where?") == ("Where?", AskOptions())
    assert ask_open_payload(b'{"kind": "not ours"}') == ('{"kind": "not ours"}', AskOptions())
    old = b'{"kind": "mnesio-ask-v1", "decoding": {"temperature": 0.5}, "question": "q", "max_new_tokens": 3}'
    assert ask_open_payload(old) == ("q", AskOptions(decoding=Decoding(temperature=0.5), max_new_tokens=3))
    looks_like = '{"kind": "mnesio-ask-v1", "decoding": {"x": 1}, "question": "q", "max_new_tokens": null}'
    assert ask_open_payload(looks_like.encode()) == (looks_like, AskOptions())
    with pytest.raises(MnesioError, match="does not open"):  # recorded as the request's error, not a crashed task
        ask_open_payload(b"\xff" + looks_like.encode())
    question = Conversation.of_dict({"system": "s", "turns": [["user", "a"], ["assistant", "b"], ["user", "c"]]})
    options = AskOptions(decoding=Decoding(stop=("x",), logprobs=True, top_logprobs=2, json_schema="{}"), max_new_tokens=3)
    assert ask_open_payload(ask_seal_payload(question, options)) == (question, options)
