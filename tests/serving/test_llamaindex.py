"""LlamaIndex's OpenAILike (llama-index-llms-openai-like, pinned) with its defaults against the real ASGI server and
the fake engine: temperature 0.1 and, unless told it is a chat model, the completions endpoint."""
from __future__ import annotations

import json

import pytest

from cartridges.models import AnswerRecord
from tests.support.openai_facts import FACTS, QUESTIONS
from tests.support.servers import token_for

pytestmark = pytest.mark.django_db(transaction=True)


def llm_for(asgi_server, user, sent: list, **kwargs):
    """OpenAILike on the server; ``sent`` collects (path, JSON body) of each request it makes."""
    import httpx
    from llama_index.llms.openai_like import OpenAILike

    def record(request: httpx.Request) -> None:
        sent.append((request.url.path, json.loads(request.content)))

    return OpenAILike(model="scope-a", api_base=f"{asgi_server.url}/v1", api_key=token_for(user), max_retries=0,
                      timeout=60, http_client=httpx.Client(event_hooks={"request": [record]}), **kwargs)


def test_it_completes_and_streams_with_openailikes_defaults(alice, scope_a, served, asgi_server):
    served(scope_a, FACTS)
    sent = []
    llm = llm_for(asgi_server, alice, sent)
    completion = llm.complete(QUESTIONS[4])
    assert completion.text == FACTS[4]  # the fake engine answers with the best memory
    deltas = [chunk.delta for chunk in llm.stream_complete(QUESTIONS[4])]
    assert len([d for d in deltas if d]) > 1 and "".join(deltas) == completion.text
    assert [path for path, _ in sent] == ["/v1/completions"] * 2  # the defaults: not a chat model, sampled a little
    assert all(body["temperature"] == 0.1 and body["prompt"] for _, body in sent) and sent[1][1]["stream"] is True
    assert AnswerRecord.objects.count() == 2


def test_it_chats_with_a_system_message_and_history_as_a_chat_model(alice, scope_a, served, asgi_server):
    from llama_index.core.llms import ChatMessage

    served(scope_a, FACTS)
    sent = []
    llm = llm_for(asgi_server, alice, sent, is_chat_model=True)
    messages = [ChatMessage(role="system", content="Answer briefly."), ChatMessage(role="user", content="Hello"),
                ChatMessage(role="assistant", content="Hi, ask away."), ChatMessage(role="user", content=QUESTIONS[5])]
    reply = llm.chat(messages)
    assert reply.message.role == "assistant" and reply.message.content == FACTS[5]
    streamed = list(llm.stream_chat(messages))
    assert streamed[-1].message.content == FACTS[5] and "".join(r.delta or "" for r in streamed) == FACTS[5]
    assert [path for path, _ in sent] == ["/v1/chat/completions"] * 2
    assert [m["role"] for m in sent[0][1]["messages"]] == ["system", "user", "assistant", "user"]
    assert AnswerRecord.objects.count() == 2
