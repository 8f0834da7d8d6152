"""/api/v1/scopes/<scope>/evaluation-cases/: attach and list the cases the gate scores, validated and scoped."""
from __future__ import annotations

import pytest

from cartridges.models import EvaluationCase
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db
URL = "/api/v1/scopes/scope-a/evaluation-cases/"


def test_it_attaches_a_case_attributed_to_the_client_and_lists_it(alice, bob, scope_a, api_client_for):
    response = api_client_for(alice).post(
        URL, {"question": "Where is the spare key?", "answers": ["flowerpot", " blue flowerpot "]}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["question"] == "Where is the spare key?" and body["answers"] == ["flowerpot", "blue flowerpot"]
    case = EvaluationCase.objects.get(pk=body["id"])
    assert case.scope == scope_a and case.created_by == alice
    listed = api_client_for(bob).get(URL).json()
    assert listed["count"] == 1 and listed["results"][0]["id"] == body["id"]


def test_an_attached_case_is_scored_by_the_gate(alice, scope_a, append, api_client_for):
    from cartridges.services import cartridge_compile, cartridge_evaluate

    append(scope_a, "The spare key is under the blue flowerpot.")
    api_client_for(alice).post(URL, {"question": "Where is the spare key?", "answers": ["flowerpot"]}, format="json")
    evaluation = cartridge_evaluate(version=cartridge_compile(scope=scope_a))
    assert evaluation.figures["accuracy"]["num_cases"] == 1 and evaluation.figures["accuracy"]["cartridge"] == 1.0


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"answers": ["x"]}, "question"),
        ({"question": "q?"}, "answers"),
        ({"question": "q?", "answers": []}, "answers"),
        ({"question": "q?", "answers": "flowerpot"}, "answers"),
        ({"question": "q?", "answers": [1, 2]}, "answers"),
        ({"question": "q?", "answers": [""]}, "answers"),
        ({"question": "q?", "answers": ["x"] * 21}, "answers"),
        ({"question": 7, "answers": ["x"]}, "question"),
        ({"question": "q?", "answers": ["x"], "id": 5}, "id"),
        ({"question": "q?", "answers": ["x"], "weight": 2}, "weight"),
    ],
)
def test_it_rejects_bad_cases_naming_the_field(alice, scope_a, api_client_for, payload, field):
    assert_error(api_client_for(alice).post(URL, payload, format="json"), 400, field)
    assert not EvaluationCase.objects.exists()


def test_it_rejects_an_oversized_case_question(alice, scope_a, api_client_for, settings):
    settings.MNESIO_MAX_QUESTION_CHARS = 10
    assert_error(api_client_for(alice).post(URL, {"question": "y" * 11, "answers": ["x"]}, format="json"), 400, "question")


def test_another_scopes_client_can_neither_list_nor_attach(charlie, alice, scope_a, api_client_for):
    api_client_for(alice).post(URL, {"question": "Where is the spare key?", "answers": ["flowerpot"]}, format="json")
    client = api_client_for(charlie)
    body = assert_error(client.get(URL), 404, "scope")
    assert "spare key" not in str(body)
    assert_error(client.post(URL, {"question": "q?", "answers": ["x"]}, format="json"), 404, "scope")
    assert EvaluationCase.objects.count() == 1
