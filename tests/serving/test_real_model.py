"""The real default model behind the streaming and OpenAI-compatible endpoints (uvicorn, ASGI): the streamed
text of every question equals its non-streamed answer, and a delta comes per decoded token."""
from __future__ import annotations

import importlib.util
import json

import openai
import pytest

from cartridges import engine
from tests.support.servers import EventStream, token_for

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

CONFIG = ("transformers", "smollm2-135m-instruct", "f32", "none")


def _bench():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench/reliability/answer_load.py"
    spec = importlib.util.spec_from_file_location("answer_load_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_streamed_answers_of_the_real_model_equal_its_answers(settings, real_backend, asgi_server, small_gate):
    from memories.services import scope_grant

    settings.MNESIO_KV_BACKEND, settings.MNESIO_KV_MODEL, settings.MNESIO_KV_DTYPE, settings.MNESIO_KV_QUANT = CONFIG
    settings.MNESIO_ANSWER_MAX_NEW_TOKENS = 8  # short answers keep the test in seconds on 2 cores
    engine.register_backend(CONFIG, real_backend)
    bench = _bench()
    scope = bench.serving_scope(backend_config=CONFIG)  # compile, gate and activate with the real model
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(username="reader")
    scope_grant(scope=scope, user=user)
    token = token_for(user)
    client = openai.OpenAI(base_url=f"{asgi_server.url}/v1", api_key=token, max_retries=0, timeout=300)
    num_deltas, questions = 0, bench.QUESTIONS[:3]
    for question in questions:
        messages = [{"role": "user", "content": question}]
        whole = client.chat.completions.create(model=scope.name, messages=messages)
        chunks = list(client.chat.completions.create(model=scope.name, messages=messages, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content and streamed, question
        assert whole.usage.completion_tokens <= 8 and whole.usage.prompt_tokens_details.cached_tokens > 0

        stream = EventStream(asgi_server.url, f"/api/v1/scopes/{scope.name}/ask/", {"question": question, "stream": True},
                             auth=f"Token {token}")
        events = list(stream.events())
        deltas = [json.loads(data)["text"] for event, data, _ in events if event == "delta"]
        done = json.loads(events[-1][1])
        assert events[-1][0] == "done" and "".join(deltas).strip() == done["answer"] == streamed
        assert 1 <= len(deltas) <= whole.usage.completion_tokens  # at most one per token (partial characters wait)
        num_deltas += len(deltas)
    assert num_deltas > 2 * len(questions)  # answers came in pieces, not whole
