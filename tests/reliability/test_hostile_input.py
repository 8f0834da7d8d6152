"""Hostile input at every endpoint that takes a body or a query: oversized and deeply nested JSON, invalid
UTF-8, huge numbers, wrong shapes. Each is answered 4xx in the house error shape; nothing is written."""
from __future__ import annotations

import pytest
from django.db import transaction

from memories.models import Memory
from tests.support.endpoints import all_routes, classify
from tests.support.isolation import BODIES

pytestmark = pytest.mark.django_db

JSON = "application/json"


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _deep_object(depth: int) -> str:
    return '{"content": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


DEEP_BODIES = {
    "deeply nested array": _deep(100_000).encode(),
    "deeply nested object": _deep_object(50_000).encode(),
}

HOSTILE_BODIES = {
    "moderately nested array": _deep(500).encode(),
    "invalid utf-8": b'{"content": "\xff\xfe\xc3\x28 broken"}',
    "lone surrogate escape": b'{"content": "\\ud800 alone", "question": "\\udfff?"}',
    "huge integer": b'{"content": "x", "log_head": ' + b"9" * 5000 + b"}",
    "huge float": b'{"log_head": 1e400, "content": 1e400, "question": 1e400}',
    "big but parseable integer": b'{"log_head": 123456789012345678901234567890}',
    "NaN": b'{"log_head": NaN, "content": NaN}',
    "not an object": b'"just a string"',
    "array": b"[1, 2, 3]",
    "truncated": b'{"content": "half',
    "NUL byte": b'{"content": "a\\u0000b", "question": "a\\u0000b"}',
    "oversized (3 MB)": b'{"content": "' + b"x" * (3 * 1024 * 1024) + b'"}',
    "wrong types": b'{"content": ["a"], "subject": {"x": 1}, "question": 12, "answers": "a", "reason": 5}',
    "empty": b"",
}


@pytest.fixture
def owner_client(alice, scope_a, api_client_for, fake_row, eager_tasks):
    """Alice's client, with one memory and an active cartridge in scope A (so every view has something to do)."""
    from cartridges.services import cartridge_activate, cartridge_compile
    from memories.services import memory_append

    memory_append(scope=scope_a, content="The spare key is under the blue flowerpot.")
    version = cartridge_compile(scope=scope_a)
    cartridge_activate(version=version)
    client = api_client_for(alice)
    client.version_pk = version.pk
    return client


def _post_routes(client):
    for route in all_routes():
        if classify(route) != "scoped-api" or "post" not in route.methods:
            continue
        values = {"scope": "scope-a", "pk": client.version_pk, "seq": 1}
        yield route.url(**{p: values[p] for p in route.params})
    yield "/api/v1/kv/configuration/"


def test_every_post_endpoint_answers_hostile_bodies_with_a_4xx(owner_client, operator, api_client_for, record_figures):
    head_before = Memory.objects.count()
    operator_client = api_client_for(operator)
    results: dict[int, int] = {}
    for url in _post_routes(owner_client):
        client = operator_client if url.startswith("/api/v1/kv/") else owner_client
        for label, body in HOSTILE_BODIES.items():
            response = client.generic("POST", url, body, content_type=JSON)
            results[response.status_code] = results.get(response.status_code, 0) + 1
            if label == "empty":  # no body is `{}`: fine where every field is optional, a 400 elsewhere
                assert response.status_code < 500, (url, label, response.status_code, response.content[:300])
                continue
            assert 400 <= response.status_code < 500, (url, label, response.status_code, response.content[:300])
            if response.get("Content-Type", "").startswith("application/json"):
                assert "message" in response.json(), (url, label, response.content[:300])
    assert Memory.objects.count() == head_before  # nothing half-written
    record_figures(scenario="hostile bodies", num_requests=sum(results.values()), statuses=results)


def test_hostile_query_and_path_values_get_a_4xx(owner_client):
    urls = [
        "/api/v1/scopes/scope-a/memories/?as_of=99999999999999999999999999",
        "/api/v1/scopes/scope-a/memories/?as_of=-1",
        "/api/v1/scopes/scope-a/memories/?as_of=1e400",
        "/api/v1/scopes/scope-a/memories/?as_of=%FF%FE",
        "/api/v1/scopes/scope-a/memories/?limit=-5&offset=-3",
        "/api/v1/scopes/scope-a/memories/99999999999999999999999999/",
        "/api/v1/scopes/scope-a/cartridges/99999999999999999999999999/",
        "/api/v1/scopes/scope-a/erasure-requests/99999999999999999999999999/",
        "/api/v1/scopes/" + "s" * 5000 + "/memories/",
        "/api/v1/scopes/%FF%FE/memories/",
        "/api/v1/kv/metrics?format=nonsense",
        "/api/v1/kv/metrics?unknown=1",
    ]
    for url in urls:
        response = owner_client.get(url)
        assert response.status_code < 500, (url, response.status_code, response.content[:300])
        # a clamped limit or offset is an acceptable answer; everything else is refused
        if "limit=" not in url:
            assert 400 <= response.status_code < 500, (url, response.status_code, response.content[:300])


@pytest.fixture
def non_empty_lists(owner_client, scope_a):
    """Give every list endpoint of scope A a row: an empty list is answered without any LIMIT query."""
    from cartridges.services import evaluation_case_add
    from memories.services import erasure_request_file, memory_append

    memory_append(scope=scope_a, subject="user-7", content="User 7 prefers tea.")
    erasure_request_file(subject="user-7", requested_by=None, reason="test", scope=scope_a)  # not enqueued
    evaluation_case_add(scope=scope_a, question="Where is the spare key?", answers=["flowerpot"])
    return owner_client


def _huge_limit_failures(client, url: str) -> list:
    failures = []
    for query in ("limit=99999999999999999999999999", "offset=99999999999999999999999999", "limit=" + "9" * 5000):
        try:
            with transaction.atomic():  # a savepoint: one failure must not poison the next request
                response = client.get(f"{url}?{query}")
            status = response.status_code
        except Exception as exc:  # the test client re-raises the view's exception
            status = f"raised {type(exc).__name__}"
        if not isinstance(status, int) or status >= 500:
            failures.append((url, query, status))
        elif query.startswith("limit=") and status == 200 and "results" in response.json():
            assert len(response.json()["results"]) >= 1  # clamped to the page bound, not refused or emptied
    return failures


@pytest.mark.postgres  # the overflow is PostgreSQL's bigint LIMIT
@pytest.mark.parametrize(
    "name",
    [
        "scope-head",
        "scope-memories",
        "erasure-requests",
        "cartridge-list",
        "evaluation-cases",
        "scope-settings",  # not a list: it ignores limit and offset, and must not fail on them either
    ],
)
def test_a_huge_limit_or_offset_on_a_list_endpoint_is_not_a_5xx(non_empty_lists, name):
    urls = {route.name: route.url(scope="scope-a") for route in all_routes() if route.name == name}
    assert set(urls) == {name}, f"route {name} is gone: update this test"
    assert not _huge_limit_failures(non_empty_lists, urls[name])


def test_every_list_endpoint_is_covered_by_the_huge_limit_test():
    names = {
        r.name for r in all_routes()
        if classify(r) == "scoped-api" and "get" in r.methods and not ({"pk", "seq"} & set(r.params))
    }
    assert names == {
        "scope-head", "scope-memories", "erasure-requests", "cartridge-list", "evaluation-cases", "scope-settings"
    }, names


@pytest.mark.parametrize("query", ["limit=abc", "limit=0", "limit=-5", "offset=-3", "offset=1.5", "limit=%00"])
def test_a_malformed_limit_or_offset_is_a_400_naming_it(owner_client, query):
    response = owner_client.get(f"/api/v1/scopes/scope-a/memories/?{query}")
    assert response.status_code == 400, (query, response.status_code)
    field = query.split("=")[0]
    assert response.json()["extra"]["field"] == field and f"`{field}`" in response.json()["message"]


def test_a_limit_above_the_bound_is_clamped_and_paging_goes_on(owner_client, scope_a):
    from core.pagination import BoundedLimitOffsetPagination
    from memories.services import memory_append

    memory_append(scope=scope_a, content="The car is on level 3.")
    body = owner_client.get("/api/v1/scopes/scope-a/memories/?limit=5000").json()
    assert body["count"] == 2 and len(body["results"]) == 2
    assert BoundedLimitOffsetPagination.max_limit == 1000
    body = owner_client.get("/api/v1/scopes/scope-a/memories/?limit=1&offset=1").json()
    assert [m["text"] for m in body["results"]] == ["The car is on level 3."] and body["next"] is None


@pytest.mark.parametrize("label", sorted(DEEP_BODIES))
def test_a_deeply_nested_body_is_a_400(owner_client, label):
    response = owner_client.generic("POST", "/api/v1/scopes/scope-a/memories/", DEEP_BODIES[label], content_type=JSON)
    assert response.status_code == 400, response.status_code


def test_a_huge_compile_head_is_refused_naming_the_field(owner_client):
    for head in (10**30, 2**63, -(2**63)):
        response = owner_client.post("/api/v1/scopes/scope-a/cartridges/compile/", data={"log_head": head}, format="json")
        assert response.status_code == 400, (head, response.status_code, response.content[:300])
        assert "log_head" in response.json()["message"]


def test_an_as_of_longer_than_python_parses_is_a_400(owner_client):
    response = owner_client.get("/api/v1/scopes/scope-a/memories/?as_of=" + "9" * 5000)
    assert response.status_code == 400 and "as_of" in response.json()["message"]


@pytest.mark.postgres  # SQLite stores a NUL in text without complaint: the bug is PostgreSQL's refusal
def test_a_scope_name_with_a_nul_byte_is_a_4xx(owner_client):
    response = owner_client.get("/api/v1/scopes/scope-a%00/memories/")
    assert 400 <= response.status_code < 500, response.status_code


def test_a_nul_or_control_character_in_any_string_field_is_a_4xx(owner_client):
    checked = 0
    for route in all_routes():
        body = BODIES.get(route.name)
        if classify(route) != "scoped-api" or not body:
            continue
        url = route.url(**{p: {"scope": "scope-a", "pk": owner_client.version_pk, "seq": 1}[p] for p in route.params})
        for field, value in body.items():
            for bad in ("nul\x00inside", "\x00"):
                bad = bad.encode().decode("unicode_escape")
                hostile = {**body, field: [bad] if isinstance(value, list) else bad}
                response = owner_client.post(url, data=hostile, format="json")
                assert 400 <= response.status_code < 500, (url, field, response.status_code, response.content[:300])
                checked += 1
    assert checked >= 8


def test_a_lone_surrogate_in_a_batch_subject_is_a_400_naming_the_item(owner_client):
    body = b'{"items": [{"content": "fine"}, {"content": "also fine", "subject": "da\\ud800na"}]}'
    before = Memory.objects.count()
    response = owner_client.generic("POST", "/api/v1/scopes/scope-a/memories/batch/", body, content_type=JSON)
    assert response.status_code == 400, (response.status_code, response.content[:300])
    error = response.json()
    assert error["code"] == "invalid_input" and error["extra"]["field"] == "items[1].subject", error
    assert Memory.objects.count() == before


def test_a_lone_surrogate_anywhere_in_any_body_is_a_400_naming_where(owner_client):
    for url, body in (
        ("/api/v1/scopes/scope-a/memories/", b'{"content": "x", "metadata": {"t\\udc00g": "v"}}'),
        ("/api/v1/scopes/scope-a/search/", b'{"query": "spare \\udfff key"}'),
        ("/api/v1/scopes/scope-a/erasure-requests/", b'{"subject": "dana", "reason": "\\ud83d"}'),
    ):
        response = owner_client.generic("POST", url, body, content_type=JSON)
        assert response.status_code == 400, (url, response.status_code, response.content[:300])
        assert response.json()["code"] == "invalid_input" and response.json()["extra"]["field"], response.json()


def _openai_post(client, body: bytes):
    return client.generic("POST", "/v1/chat/completions", body, content_type=JSON)


@pytest.fixture
def openai_client(alice, owner_client):
    from knox.models import AuthToken
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {AuthToken.objects.create(user=alice)[1]}")
    return client


def test_a_chat_completions_body_nested_100000_deep_is_a_400_in_openais_shape(openai_client):
    for body in (_deep(100_000).encode(), b'{"model": "scope-a", "messages": ' + _deep(100_000).encode() + b"}"):
        response = _openai_post(openai_client, body)
        assert response.status_code == 400, (response.status_code, response.content[:300])
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json", error


def test_a_lone_surrogate_question_on_a_model_free_web_tier_is_a_400(openai_client, settings):
    settings.MNESIO_WEB_LOADS_MODEL = False  # the question would be sealed for a gpu worker
    body = b'{"model": "scope-a", "messages": [{"role": "user", "content": "where is \\ud800 the key?"}]}'
    response = _openai_post(openai_client, body)
    assert response.status_code == 400, (response.status_code, response.content[:300])
    error = response.json()["error"]
    assert error["param"] == "messages[0].content" and error["type"] == "invalid_request_error", error
