"""The routed layout over the API (fake engine): the layout setting, a scope past the window answered end to end
(ask, streamed ask, OpenAI-compatible endpoint), the answer naming the memories it read, the metrics, and
another user getting a 404 for someone else's routed scope."""
from __future__ import annotations

import json

import pytest

from cartridges import engine
from cartridges.models import RoutedChunk
from kvengine.fake import FakeKvBackend
from tests.support.errors import assert_error

pytestmark = pytest.mark.django_db

MARKER = "quokka-vault-5521"


def _staff(username: str, permission: str):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    user = get_user_model().objects.create_user(username=username, password="x-" + username, is_staff=True)
    app_label, codename = permission.split(".")
    user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return user


def _openai_client(user):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    _, key = AuthToken.objects.create(user=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


@pytest.fixture
def over_window(scope_a, append, fake_engine):
    """Scope A past the fake's 60-token window, layout left at its default (auto), no prefix cartridge."""
    engine.register_backend(fake_engine, FakeKvBackend(max_context_tokens=60))
    for i in range(10):
        append(scope_a, f"Locker {i} holds the spare item number {i * 7} today.")
    yield append(scope_a, f"The vault code is {MARKER}.")
    engine.register_backend(fake_engine, FakeKvBackend())  # backends outlive a test: the next one gets the default window


def test_it_shows_and_changes_the_layout_in_the_scope_settings(alice, api_client_for):
    assert api_client_for(alice).get("/api/v1/scopes/scope-a/settings/").json()["layout"] == "auto"
    staff = api_client_for(_staff("sam", "cartridges.change_scope_settings"))
    response = staff.patch("/api/v1/scopes/scope-a/settings/", data={"layout": "routed"}, format="json")
    assert response.status_code == 200, response.content
    assert api_client_for(alice).get("/api/v1/scopes/scope-a/settings/").json()["layout"] == "routed"
    assert_error(staff.patch("/api/v1/scopes/scope-a/settings/", data={"layout": "sideways"}, format="json"), 400, "layout")


def test_it_answers_a_scope_past_the_window_through_the_api(alice, over_window, api_client_for):
    client = api_client_for(alice)
    response = client.post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert MARKER in body["answer"] and body["layout"] == "routed" and body["mode"] == "cartridge"
    assert over_window.seq in body["memory_seqs"] and body["version_id"] is None


def test_it_answers_a_scope_past_the_window_through_the_openai_endpoint(alice, over_window, api_client_for):
    response = _openai_client(alice).post(
        "/v1/chat/completions", {"model": "scope-a", "messages": [{"role": "user", "content": "What is the vault code?"}]},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert MARKER in response.json()["choices"][0]["message"]["content"]


def test_it_streams_a_routed_answer_as_one_delta(alice, over_window, api_client_for):
    response = _openai_client(alice).post(
        "/v1/chat/completions",
        {"model": "scope-a", "stream": True, "messages": [{"role": "user", "content": "What is the vault code?"}]},
        format="json",
    )
    assert response.status_code == 200
    events = [line[len("data: "):] for line in b"".join(response.streaming_content).decode().splitlines() if line.startswith("data: ")]
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events if e != "[DONE]" and json.loads(e)["choices"])
    assert MARKER in text


def test_it_shows_each_scopes_layout_and_chunks_in_the_kv_metrics(alice, over_window, api_client_for):
    client = api_client_for(alice)
    client.post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json")
    body = client.get("/api/v1/kv/metrics").json()
    row = next(r for r in body["scopes"] if r["scope"] == "scope-a")
    chunks = RoutedChunk.objects.filter(scope__name="scope-a")
    assert row["layout"] == "auto" and row["routed_chunks"]["count"] == chunks.count() > 0
    assert row["routed_chunks"]["size_bytes"] == sum(len(bytes(c.sealed)) for c in chunks)
    assert body["routed"]["repair"] == "full" and body["routed"]["chunk_quant"] == "q8"
    assert body["latency"]["cartridge"]["count"] == 0  # recorded as "routed": prefix cartridge figures stay its own


def test_it_gives_another_user_a_404_for_a_routed_scope(alice, charlie, over_window, api_client_for):
    api_client_for(alice).post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json")
    client = api_client_for(charlie)
    assert_error(client.post("/api/v1/scopes/scope-a/ask/", {"question": "What is the vault code?"}, format="json"), 404, "scope")
    metrics = client.get("/api/v1/kv/metrics").json()
    assert [r["scope"] for r in metrics["scopes"]] == ["scope-c"] and MARKER not in json.dumps(metrics)
