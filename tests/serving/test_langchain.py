"""LangChain's ChatOpenAI (langchain-openai, pinned) against the real model on uvicorn: invoke, stream, batch, a
history whose last question needs an earlier turn, and with_structured_output."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


class Place(BaseModel):
    city: str


QUESTION = "Where does Lena live?"


def _chat(served_real, asgi_server, **options):
    from langchain_openai import ChatOpenAI

    scope, token = served_real
    return ChatOpenAI(model=scope, base_url=f"{asgi_server.url}/v1", api_key=token, max_retries=0, timeout=300, **options)


def test_invoke_stream_and_batch_give_the_same_answer(served_real, asgi_server):
    llm = _chat(served_real, asgi_server)
    answer = llm.invoke(QUESTION)
    assert answer.content and answer.usage_metadata["output_tokens"] > 0
    assert "".join(chunk.content for chunk in llm.stream(QUESTION)) == answer.content
    assert [m.content for m in llm.batch([QUESTION, QUESTION])] == [answer.content, answer.content]


def test_a_history_whose_last_question_needs_an_earlier_turn_is_answered_from_it(served_real, asgi_server):
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    history = [SystemMessage("Answer briefly."), HumanMessage("My locker code is 4417."),
               AIMessage("Got it, your locker code is 4417."), HumanMessage("What is my locker code?")]
    assert "4417" in _chat(served_real, asgi_server).invoke(history).content


def test_a_seeded_sampling_model_repeats_its_answer(served_real, asgi_server):
    sampled = _chat(served_real, asgi_server, temperature=0.7, seed=5, stop=["\n\n"], max_tokens=12)
    assert sampled.invoke(QUESTION).content == sampled.invoke(QUESTION).content


def test_with_structured_output_parses_the_answer_into_its_model(served_real, asgi_server):
    place = _chat(served_real, asgi_server).with_structured_output(Place).invoke("Where does Lena live? Answer in JSON.")
    assert isinstance(place, Place) and place.city
