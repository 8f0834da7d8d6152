"""POST /v1/chat/completions and GET /v1/models with the official ``openai`` client against live servers."""
from __future__ import annotations

import json

import openai
import pytest

from cartridges.models import AnswerRecord
from kvengine.fake import FakeKvBackend
from tests.support.openai_facts import FACTS, QUESTIONS, client_for
from tests.support.servers import EventStream

pytestmark = pytest.mark.django_db(transaction=True)

def test_streamed_text_equals_the_non_streamed_text_on_32_questions(alice, scope_a, served, server_url):
    version = served(scope_a, FACTS)
    client = client_for(server_url, alice)
    assert len(QUESTIONS) == 32
    for question in QUESTIONS:
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}]
        whole = client.chat.completions.create(model="scope-a", messages=messages)
        chunks = list(client.chat.completions.create(model="scope-a", messages=messages, stream=True,
                                                     stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content, question
        assert whole.choices[0].message.content in FACTS  # the fake engine answers with the best memory
        assert whole.model == "scope-a" and whole.choices[0].finish_reason in ("stop", "length")
        usage = whole.usage
        assert usage.prompt_tokens_details.cached_tokens > 0 and usage.completion_tokens > 0
        assert usage.prompt_tokens > usage.prompt_tokens_details.cached_tokens
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        assert chunks[-1].usage == usage  # the streamed usage chunk says the same
        assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # really streamed
    assert AnswerRecord.objects.filter(version=version).count() == 64


def test_it_lists_the_scopes_the_token_can_ask_as_models(alice, charlie, scope_a, scope_c, server_url):
    assert [m.id for m in client_for(server_url, alice).models.list()] == ["scope-a"]
    assert [m.id for m in client_for(server_url, charlie).models.list()] == ["scope-c"]


def test_unknown_parameters_are_refused_naming_them(alice, scope_a, served, server_url):
    served(scope_a, FACTS[:2])
    client = client_for(server_url, alice)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="scope-a", messages=messages, extra_body={"frequency_penalty_x": 1})
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "frequency_penalty_x" and caught.value.body["code"] == "unknown_parameter"
    assert caught.value.body["type"] == "invalid_request_error" and "frequency_penalty_x" in caught.value.body["message"]
    for kwargs, param in (({"frequency_penalty": 0.5}, "frequency_penalty"), ({"n": 9}, "n"),
                          ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="scope-a", messages=messages, **kwargs)
        assert caught.value.body["param"] == param, kwargs
    assert client.chat.completions.create(model="scope-a", messages=messages, temperature=0, max_tokens=64).choices
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="scope-a", messages=[{"role": "assistant", "content": "hi"}])
    assert caught.value.body["param"] == "messages[0].role"
    assert not AnswerRecord.objects.filter(version__isnull=False).count() > 1


def test_errors_have_openais_shape_and_the_apis_statuses(alice, charlie, scope_a, append, server_url):
    messages = [{"role": "user", "content": "Where?"}]
    with pytest.raises(openai.AuthenticationError) as caught:
        openai.OpenAI(base_url=f"{server_url}/v1", api_key="not-a-token", max_retries=0).models.list()
    assert caught.value.status_code == 401 and set(caught.value.body) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError) as caught:  # not granted: as unknown as a missing scope
        client_for(server_url, charlie).chat.completions.create(model="scope-a", messages=messages)
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"
    # no memories yet, so no cartridge to answer from
    with pytest.raises(openai.ConflictError) as caught:
        client_for(server_url, alice).chat.completions.create(model="scope-a", messages=messages)
    assert caught.value.body["type"] == "invalid_request_error" and "mode='text'" in caught.value.body["message"]
    assert caught.value.body["code"] == "no_active_cartridge"  # the stable code /api/ gives, not null
    with pytest.raises(openai.ConflictError) as caught:  # streamed too: refused before the first chunk
        list(client_for(server_url, alice).chat.completions.create(model="scope-a", messages=messages, stream=True))
    assert caught.value.body["code"] == "no_active_cartridge"
    with pytest.raises(openai.ConflictError) as caught:
        client_for(server_url, alice).completions.create(model="scope-a", prompt="Where?")
    assert caught.value.body["code"] == "no_active_cartridge"
    append(scope_a, FACTS[0])  # still no version: the memory is read in memory, at once
    fresh = client_for(server_url, alice).chat.completions.create(
        model="scope-a", messages=[{"role": "user", "content": QUESTIONS[0]}])
    assert fresh.choices[0].message.content == FACTS[0] and fresh.model_extra["mnesio"]["version_id"] is None
    assert fresh.model_extra["mnesio"]["num_memories_after_version"] == 1
    # a raw client sees the same shape for a bad token, in either scheme (Token is accepted as on /api/)
    raw = EventStream(server_url, "/v1/chat/completions", {"model": "scope-a", "messages": messages},
                      auth="Token " + "0" * 64)
    assert raw.status == 401 and set(json.loads(raw.body())["error"]) == {"message", "type", "param", "code"}


class FailsMidStream(FakeKvBackend):
    """The fake engine whose streams fail after their first delta with an engine refusal no service renames."""

    def answer_stream(self, cartridge, question, *, max_new_tokens=32, decoding=None):
        from kvengine.errors import CorruptCartridgeError

        for item in super().answer_stream(cartridge, question, max_new_tokens=max_new_tokens, decoding=decoding):
            yield item
            raise CorruptCartridgeError("the cartridge's bytes fail a check")


def test_an_error_after_the_first_chunk_is_an_error_chunk_with_the_stable_code(alice, scope_a, served, fake_engine,
                                                                             asgi_server):
    from cartridges import engine

    engine.register_backend(fake_engine, FailsMidStream(model="fake-model"))
    try:
        served(scope_a, FACTS[:2])
        stream = client_for(asgi_server.url, alice).chat.completions.create(
            model="scope-a", messages=[{"role": "user", "content": QUESTIONS[0]}], stream=True)
        with pytest.raises(openai.APIError) as caught:
            for _ in stream:
                pass
    finally:
        engine.cache_clear(backends=True)
    assert caught.value.body["code"] == "engine_refused", caught.value.body  # /api/'s stable code, not a class name
    assert caught.value.body["type"] == "invalid_request_error"
