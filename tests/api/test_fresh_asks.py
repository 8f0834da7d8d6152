"""An ask reads the memories appended after the serving version and says how many, on /api/v1 and /v1 alike."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

KEY = "The spare key is under the blue flowerpot."
CAR = "The car is parked on level 3."


def _bearer(user):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    _, key = AuthToken.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_the_ask_says_how_many_memories_it_read_after_the_version(alice, scope_a, served, append, api_client_for):
    version = served(scope_a, [KEY])
    append(scope_a, CAR)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the car parked?"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == CAR and body["version_id"] == version.pk
    assert (body["num_memories_after_version"], body["num_memories_unread"]) == (1, 0)


def test_the_openai_answer_carries_the_count_in_its_mnesio_field(alice, scope_a, served, append):
    served(scope_a, [KEY])
    append(scope_a, CAR)
    response = _bearer(alice).post(
        "/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "Where is the car parked?"}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["message"]["content"] == CAR and body["object"] == "chat.completion"
    assert (body["mnesio"]["num_memories_after_version"], body["mnesio"]["num_memories_unread"]) == (1, 0)


def test_a_new_scope_answers_from_its_memories_before_any_version(alice, scope_a, append, api_client_for):
    append(scope_a, KEY)
    append(scope_a, CAR)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the car parked?"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["answer"] == CAR and body["mode"] == "cartridge" and body["version_id"] is None
    assert (body["num_memories_after_version"], body["num_memories_unread"]) == (2, 0)
    assert "no active version yet" in body["note"]


def test_a_new_scope_answers_over_the_openai_surface_with_the_count(alice, scope_a, append):
    append(scope_a, KEY)
    append(scope_a, CAR)
    response = _bearer(alice).post(
        "/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "Where is the spare key?"}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["choices"][0]["message"]["content"] == KEY
    assert (body["mnesio"]["version_id"], body["mnesio"]["num_memories_after_version"]) == (None, 2)


def test_an_empty_scope_is_a_409_with_its_code_on_both_surfaces(alice, scope_a, api_client_for):
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the car parked?"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "no_active_cartridge"
    assert "append memories first" in response.json()["message"]
    response = _bearer(alice).post(
        "/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "Where?"}]}, format="json",
    )
    assert response.status_code == 409 and response.json()["error"]["code"] == "no_active_cartridge"


def test_a_new_scope_over_the_bound_is_a_409_saying_what_to_do(alice, scope_a, append, api_client_for, settings):
    settings.MNESIO_FRESH_MAX_MEMORIES = 1
    append(scope_a, KEY)
    append(scope_a, CAR)
    response = api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the car parked?"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "no_active_cartridge"
    message = response.json()["message"]
    assert "MNESIO_FRESH_MAX_MEMORIES=1" in message and "compile and activate one" in message and "mode='text'" in message


def test_another_tenant_still_gets_a_404_for_a_new_scope(charlie, scope_a, append, api_client_for):
    append(scope_a, KEY)
    response = api_client_for(charlie).post("/api/v1/scopes/scope-a/ask/", {"question": "Where is the spare key?"}, format="json")
    assert response.status_code == 404 and KEY not in response.content.decode()
    response = _bearer(charlie).post(
        "/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "Where is the spare key?"}]},
        format="json",
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
