"""The real default model behind /v1/ with the official ``openai`` client (uvicorn, ASGI): a follow-up question is
answered from the earlier turn, the cartridge and re-reading agree on a conversation, and sampling, seed, stop,
length, log-probs and a JSON schema do what they say."""
from __future__ import annotations

import http.client
import json

import openai
import pytest

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

HISTORY = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "My locker code is 4417."},
           {"role": "assistant", "content": "Got it, your locker code is 4417."}]
FOLLOW_UP = {"role": "user", "content": "What is my locker code?"}


def _ask(base_url: str, scope: str, token: str, body: dict) -> dict:
    host, port = base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", f"/api/v1/scopes/{scope}/ask/", body=json.dumps(body),
                 headers={"Content-Type": "application/json", "Authorization": f"Token {token}"})
    response = conn.getresponse()
    data = json.loads(response.read())
    assert response.status == 200, data
    return data


def _client(token, asgi_server):
    return openai.OpenAI(base_url=f"{asgi_server.url}/v1", api_key=token, max_retries=0, timeout=300)


LENA = [{"role": "user", "content": "Where does Lena live?"}]


def test_it_answers_a_follow_up_from_the_earlier_turn(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    answer = client.chat.completions.create(model=scope, messages=[*HISTORY, FOLLOW_UP])
    assert "4417" in answer.choices[0].message.content
    assert answer.usage.prompt_tokens_details.cached_tokens > 0  # the memories were the cached prefix
    alone = client.chat.completions.create(model=scope, messages=[FOLLOW_UP])
    assert "4417" not in alone.choices[0].message.content  # the code was only in the conversation
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(model=scope, messages=[*HISTORY, FOLLOW_UP], stream=True) if c.choices)
    assert streamed == answer.choices[0].message.content
    # the same conversation on /api/: from the cartridge and by re-reading the memories as text, the same answer
    body = {"question": FOLLOW_UP["content"], "system": HISTORY[0]["content"],
            "history": [{"role": m["role"], "content": m["content"]} for m in HISTORY[1:]]}
    from_cartridge = _ask(asgi_server.url, scope, token, body)
    from_text = _ask(asgi_server.url, scope, token, {**body, "mode": "text"})
    assert from_cartridge["answer"] == from_text["answer"] == answer.choices[0].message.content


def test_a_seed_repeats_a_sampled_answer_and_other_seeds_vary_it(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    first = client.chat.completions.create(model=scope, messages=LENA, temperature=1.5, seed=11)
    again = client.chat.completions.create(model=scope, messages=LENA, temperature=1.5, seed=11)
    assert first.choices[0].message.content == again.choices[0].message.content
    others = {client.chat.completions.create(model=scope, messages=LENA, temperature=1.5, seed=s).choices[0].message.content
              for s in (12, 13, 14)}
    assert len(others | {first.choices[0].message.content}) > 1


def test_max_tokens_ends_at_length_and_a_stop_word_ends_before_it(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    one = client.chat.completions.create(model=scope, messages=LENA, max_tokens=1)
    assert one.usage.completion_tokens == 1 and one.choices[0].finish_reason == "length"
    word = client.chat.completions.create(model=scope, messages=LENA).choices[0].message.content.split()[1]
    stopped = client.chat.completions.create(model=scope, messages=LENA, stop=[word])
    assert word not in stopped.choices[0].message.content and stopped.choices[0].finish_reason == "stop"


def test_logprobs_score_the_greedy_answer_token_by_token(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    greedy = client.chat.completions.create(model=scope, messages=LENA)
    scored = client.chat.completions.create(model=scope, messages=LENA, logprobs=True, top_logprobs=2)
    assert scored.choices[0].message.content == greedy.choices[0].message.content
    content = scored.choices[0].logprobs.content
    assert len(content) == scored.usage.completion_tokens and all(len(t.top_logprobs) == 2 for t in content)


def test_a_json_response_format_gets_json(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    shaped = client.chat.completions.create(
        model=scope, messages=[{"role": "user", "content": "Where does Lena live? Answer in JSON."}], max_tokens=16,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert isinstance(json.loads(shaped.choices[0].message.content)["city"], str)
    loose = client.chat.completions.create(model=scope, messages=[{"role": "user", "content": "Lena's city as JSON?"}],
                                           max_tokens=16, response_format={"type": "json_object"})
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(loose.choices[0].message.content), dict)
    else:  # cut at max_tokens: still the beginning of an object
        assert loose.choices[0].message.content.startswith("{")


def test_n_sampled_choices_are_the_single_requests_with_seed_plus_i(served_real, asgi_server):
    scope, token = served_real
    client = _client(token, asgi_server)
    messages = [{"role": "user", "content": "Tell me a short story about Lena."}]
    sampled = {"temperature": 0.9, "seed": 11, "max_tokens": 8}
    three = client.chat.completions.create(model=scope, messages=messages, n=3, **sampled)
    alone = [client.chat.completions.create(model=scope, messages=messages, **{**sampled, "seed": 11 + i}) for i in range(3)]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert [c.message.content for c in three.choices] == [a.choices[0].message.content for a in alone]
    assert len({c.message.content for c in three.choices}) > 1  # three draws
    assert three.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    completions = client.completions.create(model=scope, prompt=messages[0]["content"], n=2, **sampled)
    assert [c.text for c in completions.choices] == [a.choices[0].message.content for a in alone[:2]]
