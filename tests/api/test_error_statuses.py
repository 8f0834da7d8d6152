"""One status per error kind on every path: over the context window is a 422 whether the
compile or the question hits it, asked synchronously or through a sealed answer request collected later."""
from __future__ import annotations

import pytest

from cartridges import engine
from cartridges.services import answer_request_answer, answer_request_collect, answer_request_file
from core.errors import MnesioError
from kvengine import ContextTooLongError, make_backend
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

TEXTS = ["The office wifi password is tulip.", "The team lunch is on Friday at noon."]


@pytest.fixture
def small_window(fake_engine, monkeypatch):
    """A fake backend with a 40-token window that, like the real one, refuses a prompt past it when answering."""
    backend = make_backend("fake", model="fake-model", dtype="f32", quant="none", max_context_tokens=40)
    real_answer_from_text = backend.answer_from_text

    def answer_from_text(texts, question, *, max_new_tokens=32):
        answer = real_answer_from_text(texts, question, max_new_tokens=max_new_tokens)
        if answer.num_prompt_tokens + max_new_tokens > backend.max_context_tokens:
            raise ContextTooLongError(num_tokens=answer.num_prompt_tokens + max_new_tokens, limit=backend.max_context_tokens)
        return answer

    monkeypatch.setattr(backend, "answer_from_text", answer_from_text)
    engine.register_backend(fake_engine, backend)
    yield backend
    engine.cache_clear(backends=True)  # later tests get a fake backend with the default window again


def test_a_question_past_the_window_is_a_422_asked_directly_and_through_an_answer_request(
    scope_a, alice, api_client_for, append, small_window
):
    for text in TEXTS:
        append(scope_a, text)
    long_question = "Where " + "and where " * 30 + "is the spare key?"
    response = api_client_for(alice).post(
        "/api/v1/scopes/scope-a/ask/", {"question": long_question, "mode": "text"}, format="json"
    )
    body = assert_error(response, 422, "question")
    assert body["extra"]["limit"] == 40
    assert body["code"] == "context_too_long"

    request = answer_request_file(scope=scope_a, question=long_question, mode="text")
    answer_request_answer(answer_request=request)
    with pytest.raises(MnesioError) as refused:
        answer_request_collect(answer_request=request)
    assert refused.value.status_code == 422 and refused.value.extra["kind"] == "ContextTooLong"


def test_a_compile_past_the_window_is_a_422(scope_a, alice, api_client_for, append, small_window):
    for i in range(12):
        append(scope_a, f"{TEXTS[0]} number {i}")
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/cartridges/compile/", {}, format="json")
    assert response.status_code == 422, response.content
