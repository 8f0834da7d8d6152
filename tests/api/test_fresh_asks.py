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
