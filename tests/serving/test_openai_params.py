"""The parameters OpenAI clients and frameworks send, against live servers with the fake engine: nulls and neutral
values are accepted, what is not done here is refused naming the field, the other routes and methods under /v1/
answer OpenAI's JSON error shape, and /v1/completions, models.retrieve and ``n`` work."""
from __future__ import annotations

import http.client
import json

import openai
import pytest

from cartridges.models import AnswerRecord
from tests.support.openai_facts import FACTS, QUESTIONS, client_for
from tests.support.servers import token_for

pytestmark = pytest.mark.django_db(transaction=True)

NULLS = {name: None for name in (
    "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens",
    "n", "response_format", "seed", "stop", "stream", "stream_options", "temperature", "tool_choice", "tools", "top_p",
    "user", "parallel_tool_calls", "functions", "function_call", "store", "metadata", "service_tier", "modalities",
    "reasoning_effort", "audio", "prediction", "web_search_options", "verbosity", "safety_identifier", "prompt_cache_key")}
NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "logprobs": False, "tools": [],
           "tool_choice": "none", "stop": None, "store": False, "service_tier": "auto", "modalities": ["text"], "n": 1,
           "parallel_tool_calls": False, "temperature": 0.1, "top_p": 0.9, "seed": 3, "user": "u-1", "metadata": {"a": "b"}}


def raw(base_url: str, method: str, path: str, body: object = None, token: str | None = None) -> tuple[int, str, dict]:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    response = conn.getresponse()
    data = response.read().decode()
    conn.close()
    return response.status, response.getheader("Content-Type", ""), json.loads(data) if data.startswith("{") else {"raw": data}


def test_it_accepts_a_null_for_every_optional_field_and_the_neutral_values(alice, scope_a, served, server_url):
    served(scope_a, FACTS)
    token = token_for(alice)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    for extra in (NULLS, NEUTRAL):
        status, _, body = raw(server_url, "POST", "/v1/chat/completions", {"model": "scope-a", "messages": messages, **extra}, token)
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == FACTS[0]


@pytest.mark.parametrize("field,value", [
    ("frequency_penalty", 0.5), ("presence_penalty", -1), ("logit_bias", {"50256": -100}), ("tool_choice", "required"),
    ("tools", [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]), ("store", True),
    ("reasoning_effort", "low"), ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
])
def test_it_refuses_what_it_does_not_do_as_unsupported_naming_the_field(alice, scope_a, served, live_server, field, value):
    served(scope_a, FACTS[:2])
    body = {"model": "scope-a", "messages": [{"role": "user", "content": QUESTIONS[0]}], field: value}
    status, _, answer = raw(live_server.url, "POST", "/v1/chat/completions", body, token_for(alice))
    assert status == 400
    assert answer["error"]["param"] == field and answer["error"]["code"] == "unsupported", answer
    assert field in answer["error"]["message"]


def test_it_refuses_tool_messages_and_image_parts_naming_them(alice, scope_a, served, live_server):
    served(scope_a, FACTS[:2])
    token = token_for(alice)
    for messages, param in (
        ([{"role": "user", "content": "x"}, {"role": "tool", "content": "42", "tool_call_id": "c1"},
          {"role": "user", "content": "y"}], "messages[1].role"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}], "messages[0].content"),
        ([{"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hi!"}, {"role": "user", "content": "y"}],
         "messages[1].role"),
    ):
        status, _, answer = raw(live_server.url, "POST", "/v1/chat/completions", {"model": "scope-a", "messages": messages}, token)
        assert status == 400 and answer["error"]["param"] == param, answer


def test_unknown_paths_and_methods_under_v1_answer_openais_json_error(alice, scope_a, server_url):
    token = token_for(alice)
    for method, path, status in (("POST", "/v1/embeddings", 404), ("GET", "/v1/nothing/here", 404), ("DELETE", "/v1/models", 405),
                                 ("POST", "/v1/embeddings", 404), ("GET", "/v1/chat/completions", 405)):
        for auth in (token, None):
            got, kind, body = raw(server_url, method, path, {"input": "x"} if method == "POST" else None, auth)
            expected = status if auth or status == 404 else 401
            assert got == expected and kind.startswith("application/json"), (method, path, auth, got, body)
            assert set(body["error"]) == {"message", "type", "param", "code"}
            assert isinstance(body["error"]["code"], str), body  # a stable code, never null


def test_it_retrieves_a_model_the_token_may_ask_and_no_other(alice, charlie, scope_a, scope_c, server_url):
    model = client_for(server_url, alice).models.retrieve("scope-a")
    assert model.id == "scope-a" and model.object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        client_for(server_url, alice).models.retrieve("scope-c")
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as caught:  # completions resolve the scope with the caller's grants too
        client_for(server_url, charlie).completions.create(model="scope-a", prompt="Where?")
    assert caught.value.body["code"] == "model_not_found"


def test_it_answers_n_choices_and_the_completions_endpoint(alice, scope_a, served, server_url):
    served(scope_a, FACTS)
    client = client_for(server_url, alice)
    messages = [{"role": "user", "content": QUESTIONS[1]}]
    three = client.chat.completions.create(model="scope-a", messages=messages, n=3, seed=5, temperature=0.8)
    assert [c.index for c in three.choices] == [0, 1, 2] and all(c.message.content == FACTS[1] for c in three.choices)
    one = client.chat.completions.create(model="scope-a", messages=messages)
    assert three.usage.completion_tokens == 3 * one.usage.completion_tokens
    completion = client.completions.create(model="scope-a", prompt=QUESTIONS[2], temperature=0.1)
    assert completion.object == "text_completion" and completion.choices[0].text == FACTS[2]
    streamed = "".join(c.choices[0].text for c in client.completions.create(model="scope-a", prompt=QUESTIONS[2], stream=True)
                       if c.choices)
    assert streamed == FACTS[2]
    stopped = client.chat.completions.create(model="scope-a", messages=messages, stop=[" keeps"])
    assert stopped.choices[0].message.content == FACTS[1].split(" keeps")[0] and stopped.choices[0].finish_reason == "stop"
    short = client.chat.completions.create(model="scope-a", messages=messages, max_tokens=1)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 1
    assert AnswerRecord.objects.count() == 3 + 1 + 2 + 1 + 1


def test_the_ask_endpoint_takes_a_system_text_and_history(alice, scope_a, served, live_server):
    served(scope_a, FACTS)
    token = token_for(alice)
    body = {"question": QUESTIONS[3], "system": "Be brief.",
            "history": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi, ask away."}]}
    host, port = live_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/api/v1/scopes/scope-a/ask/", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "Authorization": f"Token {token}"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    assert response.status == 200 and answer["answer"] == FACTS[3], answer
    conn.request("POST", "/api/v1/scopes/scope-a/ask/", body=json.dumps({**body, "history": [{"role": "assistant", "content": "Hi"}]}),
                 headers={"Content-Type": "application/json", "Authorization": f"Token {token}"})
    response = conn.getresponse()
    refused = json.loads(response.read())
    assert response.status == 400 and refused["extra"]["field"] == "history[0].role", refused


def test_it_decodes_n_greedy_choices_once_and_n_sampled_ones_each(alice, scope_a, served, server_url):
    served(scope_a, FACTS)
    client = client_for(server_url, alice)
    messages = [{"role": "user", "content": QUESTIONS[6]}]
    one = client.chat.completions.create(model="scope-a", messages=messages)
    for kwargs in ({}, {"temperature": 0}, {"temperature": 0, "seed": 4, "logprobs": True}):
        before = AnswerRecord.objects.count()
        greedy = client.chat.completions.create(model="scope-a", messages=messages, n=4, **kwargs)
        assert [c.index for c in greedy.choices] == [0, 1, 2, 3] and {c.message.content for c in greedy.choices} == {FACTS[6]}
        assert AnswerRecord.objects.count() == before + 1, kwargs  # argmax is deterministic: one decode serves all four
        assert greedy.usage.completion_tokens == 4 * one.usage.completion_tokens  # what the four choices hold, as OpenAI counts
    before = AnswerRecord.objects.count()
    completions = client.completions.create(model="scope-a", prompt=QUESTIONS[6], n=2)
    assert [c.text for c in completions.choices] == [FACTS[6]] * 2 and AnswerRecord.objects.count() == before + 1
    sampled = client.chat.completions.create(model="scope-a", messages=messages, n=2, temperature=0.7, seed=1)
    assert len(sampled.choices) == 2 and AnswerRecord.objects.count() == before + 3  # each sampled choice is its own draw


def test_it_answers_with_no_tools_offered_and_refuses_offered_tools_as_unsupported(alice, scope_a, served, server_url):
    served(scope_a, FACTS)
    client = client_for(server_url, alice)
    messages = [{"role": "user", "content": QUESTIONS[7]}]
    for kwargs in ({"tools": [], "tool_choice": "none", "parallel_tool_calls": None},
                   {"tools": None, "tool_choice": None, "parallel_tool_calls": None},
                   {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}):
        answer = client.chat.completions.create(model="scope-a", messages=messages, **kwargs)
        assert answer.choices[0].message.content == FACTS[7] and not answer.choices[0].message.tool_calls, kwargs
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    for kwargs, param in (({"tools": [tool]}, "tools"), ({"tools": [tool], "tool_choice": "none"}, "tools"),
                          ({"tool_choice": {"type": "function", "function": {"name": "lookup"}}}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="scope-a", messages=messages, **kwargs)
        assert caught.value.body["param"] == param and caught.value.body["code"] == "unsupported", kwargs


HOSTILE_SCHEMAS = [
    {"type": 5}, {"properties": 5}, {"type": "object", "properties": {"a": {"type": "nope"}}}, {"anyOf": 5},
    {"enum": 5}, {"required": "a"}, {"$ref": "#/nope"}, {"$ref": "https://example.com/s.json"},
    {"$defs": {"a": {"type": 7}}, "$ref": "#/$defs/a"}, {"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}},
]


def test_it_refuses_a_response_format_schema_that_is_no_json_schema(alice, scope_a, served, live_server):
    served(scope_a, FACTS[:2])
    token = token_for(alice)
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    for schema in HOSTILE_SCHEMAS:
        for stream in (False, True):
            body = {"model": "scope-a", "messages": messages, "stream": stream,
                    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
            status, kind, answer = raw(live_server.url, "POST", "/v1/chat/completions", body, token)
            assert status == 400 and kind.startswith("application/json"), (schema, stream, status, answer)
            assert answer["error"]["param"] == "response_format" and answer["error"]["code"] == "invalid_value", answer


def test_every_schema_it_accepts_builds_the_json_constraints_parser(db):
    from lmformatenforcer import JsonSchemaParser

    from cartridges.api.openai_params import InvalidRequest, parse

    good = [{"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": ["integer", "null"]}},
             "required": ["city"]},
            {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}}}}, "type": "object",
             "properties": {"p": {"$ref": "#/$defs/p"}}}, {}]
    for schema in good + HOSTILE_SCHEMAS:
        body = {"model": "m", "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        try:
            parsed = parse(body, chat=True)
        except InvalidRequest as exc:
            assert schema in HOSTILE_SCHEMAS and exc.extra["field"] == "response_format", schema
            continue
        assert schema in good, schema
        JsonSchemaParser(json.loads(parsed.options.decoding.json_schema) or None)  # what kvengine/sampling.py builds
