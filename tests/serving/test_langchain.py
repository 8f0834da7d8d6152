"""LangChain's ChatOpenAI (langchain-openai, pinned) against the real model on uvicorn: invoke, stream, batch, a
history whose last question needs an earlier turn, and with_structured_output."""
from __future__ import annotations

import pytest
from pydantic import BaseModel

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]


class Place(BaseModel):
    city: str


def test_langchain_invokes_streams_batches_keeps_history_and_structures(served_real, asgi_server):  # noqa: F811
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    scope, token = served_real
    llm = ChatOpenAI(model=scope, base_url=f"{asgi_server.url}/v1", api_key=token, max_retries=0, timeout=300)
    question = "Where does Lena live?"
    answer = llm.invoke(question)
    assert answer.content and answer.usage_metadata["output_tokens"] > 0
    assert "".join(chunk.content for chunk in llm.stream(question)) == answer.content
    assert [m.content for m in llm.batch([question, question])] == [answer.content, answer.content]
    history = [SystemMessage("Answer briefly."), HumanMessage("My locker code is 4417."),
               AIMessage("Got it, your locker code is 4417."), HumanMessage("What is my locker code?")]
    assert "4417" in llm.invoke(history).content
    sampled = ChatOpenAI(model=scope, base_url=f"{asgi_server.url}/v1", api_key=token, max_retries=0, timeout=300,
                         temperature=0.7, seed=5, stop=["\n\n"], max_tokens=12)
    assert sampled.invoke(question).content == sampled.invoke(question).content
    place = llm.with_structured_output(Place).invoke("Where does Lena live? Answer in JSON.")
    assert isinstance(place, Place) and place.city
