"""POST /api/v1/scopes/<scope>/ask/: answers from the active cartridge (or re-reads as text), validated, scoped."""
from __future__ import annotations

import pytest

from cartridges.models import AnswerRecord
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

KEY = "The spare key is under the blue flowerpot."
TEA = "Ada drinks green tea every morning."


def test_it_answers_from_the_active_cartridge_with_version_and_timings(alice, scope_a, served, api_client_for):
    version = served(scope_a, [KEY, TEA])
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == KEY and body["mode"] == "cartridge" and body["version_id"] == version.pk
    assert body["total_s"] >= body["ttft_s"] >= 0 and body["num_context_tokens"] > 0
    record = AnswerRecord.objects.get()
    assert (record.version_id, record.mode, record.actor) == (version.pk, "cartridge", alice)


def test_it_re_reads_the_memories_as_text_when_asked_and_says_so(alice, scope_a, append, api_client_for):
    append(scope_a, TEA)
    response = api_client_for(alice).post(
        "/api/v1/scopes/scope-a/ask/", {"question": "What does Ada drink?", "mode": "text"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == TEA and body["mode"] == "text" and body["version_id"] is None
    assert "re-reading" in body["note"]


def test_it_refuses_cartridge_mode_for_a_scope_with_nothing_to_answer_from(alice, scope_a, api_client_for):
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "What does Ada drink?"}, format="json")
    body = assert_error(response, 409, "scope")
    assert "append memories first" in body["message"] and body["code"] == "no_active_cartridge"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "question"),
        ({"question": ""}, "question"),
        ({"question": "   "}, "question"),
        ({"question": 42}, "question"),
        ({"question": ["where?"]}, "question"),
        ({"question": "Where?", "mode": "telepathy"}, "mode"),
        ({"question": "Where?", "mode": None}, "mode"),
        ({"question": "Where?", "temperature": 0.7}, "temperature"),
    ],
)
def test_it_rejects_bad_input_naming_the_field(alice, scope_a, served, api_client_for, payload, field):
    served(scope_a, [KEY])
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", payload, format="json")
    assert_error(response, 400, field)
    assert not AnswerRecord.objects.exists()


def test_it_rejects_an_oversized_question_naming_the_limit(alice, scope_a, served, api_client_for, settings):
    served(scope_a, [KEY])
    settings.MNESIO_MAX_QUESTION_CHARS = 30
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "x" * 31}, format="json")
    body = assert_error(response, 400, "question")
    assert "31" in body["message"] and "30" in body["message"]


@pytest.mark.parametrize("body", ["not json", "[1, 2]", "null"])
def test_it_rejects_a_body_that_is_not_a_json_object(alice, scope_a, api_client_for, body):
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", body, content_type="application/json")
    assert_error(response, 400, "body")


def test_another_scopes_client_cannot_ask(charlie, alice, scope_a, served, api_client_for):
    served(scope_a, [KEY])
    response = api_client_for(charlie).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
    body = assert_error(response, 404, "scope")
    assert "flowerpot" not in str(body)
    assert not AnswerRecord.objects.exists()


def test_it_answers_404_for_an_unknown_scope_and_401_without_a_token(alice, api_client_for):
    from rest_framework.test import APIClient

    assert_error(api_client_for(alice).post("/api/v1/scopes/nope/ask/", {"question": "q?"}, format="json"), 404, "scope")
    assert APIClient().post("/api/v1/scopes/scope-a/ask/", {"question": "q?"}, format="json").status_code == 401
