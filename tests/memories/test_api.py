"""The memories API: what a granted client can do, and how every bad input is answered."""
from __future__ import annotations

import logging

import pytest

from memories.models import ErasureEvent, ErasureRequest, LogHead, Memory, ScopeKey, Subject
from memories.services import memory_append
from memories.tasks import erasure_request_process_task

pytestmark = pytest.mark.django_db


def _counts() -> dict[str, int]:
    """Row counts of every table a write could touch (nothing half-written means none of these move)."""
    return {
        "memories": Memory.objects.count(),
        "subjects": Subject.objects.count(),
        "scope_keys": ScopeKey.objects.count(),
        "head": LogHead.objects.values_list("head", flat=True).first() or 0,
        "erasure_requests": ErasureRequest.objects.count(),
        "erasure_events": ErasureEvent.objects.count(),
    }


@pytest.fixture
def client_a(alice, api_client_for):
    return api_client_for(alice)


def test_a_granted_client_appends_lists_reads_and_gets_the_head(client_a, bob, api_client_for):
    r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "Alice's dog is Rex.", "subject": "alice"}, format="json")
    assert r.status_code == 201, r.json()
    assert r.json() | {"created_at": None} == {
        "seq": 1, "subject": "alice", "content": "Alice's dog is Rex.", "text": "Alice's dog is Rex.", "erased": False,
        "created_at": None, "metadata": {},
    }
    client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "Team standup is at 9."}, format="json")

    # bob is in A's team: he reads what alice wrote.
    client_b = api_client_for(bob)
    r = client_b.get("/api/v1/scopes/scope-a/memories/")
    assert r.status_code == 200
    body = r.json()
    assert body["as_of"] == 2 and body["count"] == 2
    assert [(m["seq"], m["text"]) for m in body["results"]] == [(1, "Alice's dog is Rex."), (2, "Team standup is at 9.")]
    assert client_b.get("/api/v1/scopes/scope-a/memories/2/").json()["text"] == "Team standup is at 9."
    assert client_b.get("/api/v1/scopes/scope-a/head/").json() == {"scope": "scope-a", "head": 2, "scope_head": 2}
    assert [s["name"] for s in client_b.get("/api/v1/scopes/").json()] == ["scope-a"]


def test_it_reads_as_of_a_past_head_and_pins_it_in_page_links(client_a, scope_a):
    for i in range(5):
        memory_append(scope=scope_a, content=f"fact {i}")
    r = client_a.get("/api/v1/scopes/scope-a/memories/?as_of=3&limit=2")
    body = r.json()
    assert body["count"] == 3 and [m["seq"] for m in body["results"]] == [1, 2]
    assert "as_of=3" in body["next"]
    memory_append(scope=scope_a, content="later")
    r = client_a.get("/api/v1/scopes/scope-a/memories/?limit=2")
    assert "as_of=6" in r.json()["next"]
    assert [m["seq"] for m in client_a.get(r.json()["next"]).json()["results"]] == [3, 4]


def test_it_returns_the_original_row_for_a_repeated_idempotency_key(client_a):
    payload = {"content": "Buy milk.", "idempotency_key": "req-1"}
    statuses = [client_a.post("/api/v1/scopes/scope-a/memories/", payload, format="json").status_code for _ in range(5)]
    assert statuses == [201, 200, 200, 200, 200]
    assert Memory.objects.count() == 1


def test_it_shows_erased_memories_as_erased_after_an_erasure_request(client_a, scope_a, django_capture_on_commit_callbacks, monkeypatch):
    memory_append(scope=scope_a, subject="p-1", content="p-1's phone is 555-0100.")
    memory_append(scope=scope_a, subject="p-2", content="p-2 likes jazz.")
    monkeypatch.setattr(
        erasure_request_process_task, "apply_async", lambda args, **options: erasure_request_process_task.apply(args=args)
    )
    with django_capture_on_commit_callbacks(execute=True):
        r = client_a.post("/api/v1/scopes/scope-a/erasure-requests/", {"subject": "p-1", "reason": "user asked"}, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["status"] == "keys_shredded" and r.json()["requested_by"] == "alice"  # shredded in the request
    status = client_a.get(f"/api/v1/scopes/scope-a/erasure-requests/{r.json()['id']}/").json()
    assert status["status"] == "views_rebuilt"
    assert [e["status"] for e in status["events"]] == ["requested", "keys_shredded", "views_rebuilt"]
    assert [e["id"] for e in client_a.get("/api/v1/scopes/scope-a/erasure-requests/").json()["results"]] == [r.json()["id"]]
    results = client_a.get("/api/v1/scopes/scope-a/memories/").json()["results"]
    assert [(m["subject"], m["text"], m["erased"]) for m in results] == [
        ("p-1", None, True),
        ("p-2", "p-2 likes jazz.", False),
    ]
    assert client_a.get("/api/v1/scopes/scope-a/memories/1/").json()["erased"] is True
    r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "p-1 is back", "subject": "p-1"}, format="json")
    assert r.status_code == 409 and "`subject` 'p-1' was erased" in r.json()["message"]


BAD_INPUTS = [
    # (method, path, body or raw string, expected status, field named in the message)
    ("post", "/api/v1/scopes/scope-a/memories/", '{"content": "unterminated', 400, "body"),
    ("post", "/api/v1/scopes/scope-a/memories/", '["a", "list"]', 400, "body"),
    ("post", "/api/v1/scopes/scope-a/memories/", {}, 400, "content"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": ""}, 400, "content"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "   "}, 400, "content"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "x" * 8193}, 400, "content"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": None}, 400, "content"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "ok", "contnet": "typo"}, 400, "contnet"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "ok", "subject": ""}, 400, "subject"),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "ok", "subject": "s" * 201}, 400, "subject"),
    ("post", "/api/v1/scopes/nope/memories/", {"content": "ok"}, 404, "scope"),
    ("get", "/api/v1/scopes/nope/memories/", None, 404, "scope"),
    ("get", "/api/v1/scopes/nope/head/", None, 404, "scope"),
    ("get", "/api/v1/scopes/scope-a/memories/?as_of=abc", None, 400, "as_of"),
    ("get", "/api/v1/scopes/scope-a/memories/?as_of=2.5", None, 400, "as_of"),
    ("get", "/api/v1/scopes/scope-a/memories/?as_of=-1", None, 400, "as_of"),
    ("get", "/api/v1/scopes/scope-a/memories/?as_of=999", None, 400, "as_of"),
    ("get", "/api/v1/scopes/scope-a/memories/999/", None, 404, "seq"),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", '{"subject": ', 400, "body"),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", {"reason": "asked"}, 400, "subject"),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", {"subject": "p-1"}, 400, "reason"),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", {"subject": "p-1", "reason": ""}, 400, "reason"),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", {"subject": "nobody", "reason": "asked"}, 404, "subject"),
    ("get", "/api/v1/scopes/scope-a/erasure-requests/999/", None, 404, "id"),
]


@pytest.mark.parametrize("method, path, body, expected, field", BAD_INPUTS)
def test_it_answers_bad_input_with_a_4xx_naming_the_field_and_writes_nothing(
    client_a, scope_a, method, path, body, expected, field
):
    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    before = _counts()
    if isinstance(body, str):
        r = getattr(client_a, method)(path, body, content_type="application/json")
    else:
        r = getattr(client_a, method)(path, body, format="json")
    assert r.status_code == expected, r.content
    assert f"`{field}`" in r.json()["message"], r.json()
    assert _counts() == before


SCOPE_A_ENDPOINTS = [
    ("get", "/api/v1/scopes/scope-a/head/", None),
    ("get", "/api/v1/scopes/scope-a/memories/", None),
    ("post", "/api/v1/scopes/scope-a/memories/", {"content": "charlie was here"}),
    ("get", "/api/v1/scopes/scope-a/memories/1/", None),
    ("get", "/api/v1/scopes/scope-a/erasure-requests/", None),
    ("post", "/api/v1/scopes/scope-a/erasure-requests/", {"subject": "p-1", "reason": "charlie wants it gone"}),
    ("get", "/api/v1/scopes/scope-a/erasure-requests/{request_id}/", None),
]


@pytest.fixture
def scope_a_with_data(scope_a, alice):
    from memories.services import erasure_request_file

    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    return erasure_request_file(subject="p-1", requested_by=alice, reason="asked", scope=scope_a)


@pytest.mark.parametrize("method, path, body", SCOPE_A_ENDPOINTS)
def test_every_endpoint_refuses_a_client_of_another_scope(scope_a_with_data, charlie, api_client_for, method, path, body):
    before = _counts()
    path = path.format(request_id=scope_a_with_data.pk)
    r = getattr(api_client_for(charlie), method)(path, body, format="json")
    # the same 404 as a scope that does not exist: a client cannot probe for other tenants' scope names
    assert r.status_code == 404, r.content
    unknown = getattr(api_client_for(charlie), method)(path.replace("scope-a", "scope-zz"), body, format="json")
    assert r.json()["message"] == unknown.json()["message"].replace("scope-zz", "scope-a")
    assert "Ghent" not in r.content.decode()
    assert _counts() == before


@pytest.mark.parametrize("method, path, body", SCOPE_A_ENDPOINTS)
def test_every_endpoint_refuses_staff_without_a_grant_and_anonymous_clients(
    scope_a_with_data, api_client_for, method, path, body
):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    root = get_user_model().objects.create_superuser(username="root", email="root@example.com", password="pw")
    path = path.format(request_id=scope_a_with_data.pk)
    assert getattr(api_client_for(root), method)(path, body, format="json").status_code == 404
    assert getattr(APIClient(), method)(path, body, format="json").status_code == 401


def test_the_scope_list_shows_only_granted_scopes(scope_a, charlie, api_client_for):
    assert [s["name"] for s in api_client_for(charlie).get("/api/v1/scopes/").json()] == ["scope-c"]


def test_listing_memories_takes_a_fixed_number_of_queries(client_a, scope_a, django_assert_num_queries):
    for i in range(30):
        memory_append(scope=scope_a, subject=f"p-{i % 5}", content=f"fact {i}")
    memory_append(scope=scope_a, content="no subject")
    # token, scope joined with its grant, the scope's head, count, page (rows joined with subject and scope key)
    with django_assert_num_queries(5):
        r = client_a.get("/api/v1/scopes/scope-a/memories/")
    assert r.json()["count"] == 31


def test_it_logs_no_plaintext(client_a, caplog):
    secret = "The vault combination is 31-41-59."
    with caplog.at_level(logging.DEBUG):
        client_a.post("/api/v1/scopes/scope-a/memories/", {"content": secret, "subject": "p-1"}, format="json")
        client_a.get("/api/v1/scopes/scope-a/memories/")
        client_a.post("/api/v1/scopes/scope-a/memories/", {"content": secret + "x" * 9000}, format="json")
        r = client_a.post("/api/v1/scopes/scope-a/memories/", {"content": "other", "idempotency_key": "k"}, format="json")
        client_a.post("/api/v1/scopes/scope-a/memories/", {"content": secret, "idempotency_key": "k"}, format="json")
    assert r.status_code == 201
    assert "31-41-59" not in caplog.text
    assert "memories appended num=1 seqs=1..1" in caplog.text


def test_filing_succeeds_and_shows_failed_when_rebuilding_fails_in_process(
    client_a, scope_a, django_capture_on_commit_callbacks, monkeypatch
):
    from memories import registry

    memory_append(scope=scope_a, subject="p-1", content="p-1 lives in Ghent.")
    # As with no broker configured: the task runs in-process, retries included.
    monkeypatch.setattr(
        erasure_request_process_task, "apply_async",
        lambda args, **options: erasure_request_process_task.apply(args=args, throw=True),
    )

    def broken(erasure_request):
        raise RuntimeError("cartridge store offline")

    registry.register_view_rebuilder(broken)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            r = client_a.post("/api/v1/scopes/scope-a/erasure-requests/", {"subject": "p-1", "reason": "asked"}, format="json")
    finally:
        registry.unregister_view_rebuilder(broken)
    assert r.status_code == 201
    status = client_a.get(f"/api/v1/scopes/scope-a/erasure-requests/{r.json()['id']}/").json()
    assert status["status"] == "failed"
    assert "RuntimeError: cartridge store offline" in status["events"][-1]["detail"]
    assert client_a.get("/api/v1/scopes/scope-a/memories/1/").json()["erased"] is True  # the shred still happened
